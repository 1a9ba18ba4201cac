package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"text/template"

	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"
)

// RuleFile is a Prometheus rule file (the subset of its schema the kit
// uses; any other key is an error).
type RuleFile struct {
	Groups []RuleGroup `yaml:"groups"`
}

// RuleGroup is one group of a rule file.
type RuleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval,omitempty"`
	Rules    []Rule `yaml:"rules"`
}

// Rule is an alerting rule (Alert set) or a recording rule (Record set).
type Rule struct {
	Alert         string            `yaml:"alert,omitempty"`
	Record        string            `yaml:"record,omitempty"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for,omitempty"`
	KeepFiringFor string            `yaml:"keep_firing_for,omitempty"`
	Labels        map[string]string `yaml:"labels,omitempty"`
	Annotations   map[string]string `yaml:"annotations,omitempty"`
}

// Severities are the values an alert's severity label may take.
var Severities = map[string]bool{"critical": true, "warning": true, "info": true}

var (
	alertNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	recordRE    = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// ParseRules reads a rule file and checks its structure: named groups,
// each rule either an alert or a recording rule with an expression that
// parses (ParseExpr), durations Prometheus reads, and for every alert a
// severity label (Severities), summary and description annotations, and
// label and annotation templates that parse as Prometheus's Go templates.
// It returns the file and every rule's expression.
func ParseRules(b []byte) (*RuleFile, []Query, error) {
	var rf RuleFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		return nil, nil, fmt.Errorf("parsing the rule file: %w", err)
	}
	var errs []error
	var qs []Query
	if len(rf.Groups) == 0 {
		errs = append(errs, errors.New("no groups"))
	}
	groups, alerts := map[string]bool{}, map[string]bool{}
	for gi, g := range rf.Groups {
		where := fmt.Sprintf("group %d %q", gi, g.Name)
		if g.Name == "" || groups[g.Name] {
			errs = append(errs, fmt.Errorf("%s: name missing or used twice", where))
		}
		groups[g.Name] = true
		if err := checkDuration(g.Interval); err != nil {
			errs = append(errs, fmt.Errorf("%s: interval: %w", where, err))
		}
		if len(g.Rules) == 0 {
			errs = append(errs, fmt.Errorf("%s: no rules", where))
		}
		for ri, r := range g.Rules {
			rw := fmt.Sprintf("%s rule %d", where, ri)
			switch {
			case r.Alert != "" && r.Record != "", r.Alert == "" && r.Record == "":
				errs = append(errs, fmt.Errorf("%s: set exactly one of alert and record", rw))
			case r.Alert != "":
				rw = "alert " + r.Alert
				if !alertNameRE.MatchString(r.Alert) || alerts[r.Alert] {
					errs = append(errs, fmt.Errorf("%s: bad name or defined twice", rw))
				}
				alerts[r.Alert] = true
				errs = append(errs, checkAlert(rw, &r)...)
			default:
				rw = "record " + r.Record
				if !recordRE.MatchString(r.Record) {
					errs = append(errs, fmt.Errorf("%s: bad metric name", rw))
				}
				if r.For != "" || r.KeepFiringFor != "" || len(r.Annotations) > 0 {
					errs = append(errs, fmt.Errorf("%s: for, keep_firing_for and annotations are for alerts", rw))
				}
			}
			if _, err := ParseExpr(r.Expr); err != nil {
				errs = append(errs, fmt.Errorf("%s: expr: %w", rw, err))
				continue
			}
			qs = append(qs, Query{Where: rw, Expr: r.Expr})
		}
	}
	return &rf, qs, errors.Join(errs...)
}

func checkAlert(where string, r *Rule) []error {
	var errs []error
	if err := checkDuration(r.For); err != nil {
		errs = append(errs, fmt.Errorf("%s: for: %w", where, err))
	}
	if err := checkDuration(r.KeepFiringFor); err != nil {
		errs = append(errs, fmt.Errorf("%s: keep_firing_for: %w", where, err))
	}
	if !Severities[r.Labels["severity"]] {
		errs = append(errs, fmt.Errorf("%s: labels.severity %q, want critical, warning or info", where, r.Labels["severity"]))
	}
	for _, k := range []string{"summary", "description"} {
		if r.Annotations[k] == "" {
			errs = append(errs, fmt.Errorf("%s: annotations.%s is missing", where, k))
		}
	}
	for kind, m := range map[string]map[string]string{"label": r.Labels, "annotation": r.Annotations} {
		for k, v := range m {
			if !labelNameRE.MatchString(k) {
				errs = append(errs, fmt.Errorf("%s: bad %s name %q", where, kind, k))
			}
			if err := checkTemplate(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %s %s: %w", where, kind, k, err))
			}
		}
	}
	return errs
}

func checkDuration(s string) error {
	if s == "" {
		return nil
	}
	_, err := model.ParseDuration(s)
	return err
}

// templateFuncs stand in for the functions Prometheus gives alert
// templates, so that a template that calls one parses.
var templateFuncs = template.FuncMap{}

func init() {
	stub := func(...any) any { return nil }
	for _, f := range []string{"args", "externalURL", "first", "graphLink", "humanize", "humanize1024",
		"humanizeDuration", "humanizePercentage", "humanizeTimestamp", "label", "match", "parseDuration",
		"pathPrefix", "query", "reReplaceAll", "safeHtml", "sortByLabel", "strvalue", "stripDomain", "stripPort",
		"tableLink", "title", "toDuration", "toLower", "toTime", "toUpper", "value"} {
		templateFuncs[f] = stub
	}
}

// checkTemplate parses text the way Prometheus expands an alert's labels
// and annotations: a Go template with $labels, $externalLabels and $value
// defined.
func checkTemplate(text string) error {
	const defs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$value := .Value}}"
	_, err := template.New("").Option("missingkey=zero").Funcs(templateFuncs).Parse(defs + text)
	return err
}
