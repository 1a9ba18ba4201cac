package deploy

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Exposition is what one scrape of /metrics exported: every sample name
// (a histogram's _bucket, _sum and _count series each count), with the
// label names seen on it.
type Exposition struct {
	samples map[string]map[string]bool
	// types are the # TYPE lines: family name -> counter, gauge,
	// histogram, ...
	types map[string]string
}

// Limits of ParseExposition.
const (
	expositionLineBytesMax = 1 << 20
	expositionLinesMax     = 1 << 20
)

// ParseExposition reads the Prometheus text format (version 0.0.4).
func ParseExposition(r io.Reader) (*Exposition, error) {
	e := &Exposition{samples: map[string]map[string]bool{}, types: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), expositionLineBytesMax)
	for n := 1; sc.Scan(); n++ {
		if n > expositionLinesMax {
			return nil, fmt.Errorf("more than %d lines", expositionLinesMax)
		}
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if line[0] == '#' {
			if f := strings.Fields(line); len(f) >= 4 && f[1] == "TYPE" {
				e.types[f[2]] = f[3]
			}
			continue
		}
		name, labels, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		set := e.samples[name]
		if set == nil {
			set = map[string]bool{}
			e.samples[name] = set
		}
		for _, l := range labels {
			set[l] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(e.samples) == 0 {
		return nil, fmt.Errorf("no samples")
	}
	return e, nil
}

// parseSample returns the name and label names of one sample line:
// name{l1="v",l2="v"} value [timestamp].
func parseSample(line string) (string, []string, error) {
	i := 0
	for i < len(line) && isIdentChar(line[i]) {
		i++
	}
	name := line[:i]
	if !validIdent(name) {
		return "", nil, fmt.Errorf("bad sample %q", line)
	}
	var labels []string
	if i < len(line) && line[i] == '{' {
		i++
		for {
			for i < len(line) && (line[i] == ' ' || line[i] == ',') {
				i++
			}
			if i < len(line) && line[i] == '}' {
				break
			}
			start := i
			for i < len(line) && isIdentChar(line[i]) {
				i++
			}
			if start == i || i+1 >= len(line) || line[i] != '=' || line[i+1] != '"' {
				return "", nil, fmt.Errorf("bad labels in %q", line)
			}
			labels = append(labels, line[start:i])
			i += 2
			for i < len(line) && line[i] != '"' {
				if line[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(line) {
				return "", nil, fmt.Errorf("unterminated label value in %q", line)
			}
			i++
		}
	}
	return name, labels, nil
}

// Has reports whether a sample named name was exported.
func (e *Exposition) Has(name string) bool { return e.samples[name] != nil }

// Names are the exported sample names, sorted.
func (e *Exposition) Names() []string {
	out := make([]string, 0, len(e.samples))
	for n := range e.samples {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// scrapeLabels are added by Prometheus to every series it scrapes.
var scrapeLabels = map[string]bool{"job": true, "instance": true}

// SyntheticMetrics are series Prometheus makes for every target itself;
// an expression may use them though no node exports them.
var SyntheticMetrics = map[string]bool{
	"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true,
	"scrape_samples_post_metric_relabeling": true, "scrape_series_added": true,
}

// Check lists what is wrong with expr against this exposition: it does
// not parse, names a metric that was not exported (sample names: a
// histogram is used as name_bucket, name_sum or name_count, and the bare
// family name is an error, since Prometheus stores no series by it), or a
// label that none of its metrics carry. vars are the template variables
// the expression may use (nil: none).
func (e *Exposition) Check(expr string, vars map[string]bool) []error {
	x, err := ParseExpr(expr)
	if err != nil {
		return []error{err}
	}
	var errs []error
	if len(x.Metrics) == 0 {
		errs = append(errs, fmt.Errorf("names no metric"))
	}
	have := map[string]bool{}
	for l := range scrapeLabels {
		have[l] = true
	}
	for _, m := range x.Metrics {
		if SyntheticMetrics[m] {
			continue
		}
		if !e.Has(m) {
			hint := ""
			if t := e.types[m]; t == "histogram" || t == "summary" {
				hint = fmt.Sprintf(" (a %s: use %s_bucket, %s_sum or %s_count)", t, m, m, m)
			} else if near := e.nearest(m); near != "" {
				hint = fmt.Sprintf(" (did you mean %s?)", near)
			}
			errs = append(errs, fmt.Errorf("metric %s is not exported by kvnode%s", m, hint))
			continue
		}
		for l := range e.samples[m] {
			have[l] = true
		}
	}
	// Which labels an expression may group by is known only when every
	// metric it names is known.
	allKnown := true
	for _, m := range x.Metrics {
		allKnown = allKnown && (e.Has(m) || SyntheticMetrics[m])
	}
	for m, labels := range x.Matched {
		for _, l := range labels {
			switch {
			case scrapeLabels[l]:
			case m == "" || SyntheticMetrics[m]:
				// A selector without a name, or on a series Prometheus
				// makes: checked with the grouping labels below.
				if allKnown && !have[l] {
					errs = append(errs, fmt.Errorf("label %s is on none of the metrics the expression names", l))
				}
			case e.Has(m) && !e.samples[m][l]:
				errs = append(errs, fmt.Errorf("metric %s has no label %s (it has %s)", m, l, e.labelList(m)))
			}
		}
	}
	for _, l := range x.Created {
		have[l] = true
	}
	for _, l := range x.Grouping {
		if allKnown && !have[l] {
			errs = append(errs, fmt.Errorf("grouping label %s is on none of the metrics the expression names", l))
		}
	}
	for _, v := range x.Vars {
		if !vars[v] && !grafanaBuiltins[v] {
			errs = append(errs, fmt.Errorf("template variable $%s is not defined", v))
		}
	}
	return errs
}

func (e *Exposition) labelList(m string) string {
	var ls []string
	for l := range e.samples[m] {
		ls = append(ls, l)
	}
	if len(ls) == 0 {
		return "none"
	}
	slices.Sort(ls)
	return strings.Join(ls, ", ")
}

// nearest is an exported name within a small edit distance of m ("" if
// none), for the error message.
func (e *Exposition) nearest(m string) string {
	const limit = 4
	best, bestD := "", limit
	for n := range e.samples {
		if d := editDistance(m, n, limit); d < bestD || (d == bestD && d < limit && n < best) {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, or at least limit
// when it is limit or more.
func editDistance(a, b string, limit int) int {
	if d := len(a) - len(b); d >= limit || -d >= limit {
		return limit
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin >= limit {
			return limit
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// grafanaBuiltins are the variables Grafana defines itself.
var grafanaBuiltins = map[string]bool{
	"__rate_interval": true, "__interval": true, "__interval_ms": true, "__range": true, "__range_s": true,
	"__range_ms": true, "__dashboard": true, "__name": true, "__org": true, "__user": true,
}
