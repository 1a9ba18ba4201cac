package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Query is one PromQL expression of the kit and where it stands.
type Query struct {
	Where string // e.g. `panel 4 "Commit latency by stage" target B`
	Expr  string
}

// Dashboard is what the checks need of a Grafana dashboard.
type Dashboard struct {
	Title, UID string
	// Panels counts the panels, rows included.
	Panels int
	// Queries are the PromQL expressions of every panel target and of the
	// template variables (label_values(m, l) becomes `group by (l) (m)`).
	Queries []Query
	// Vars are the template variables the dashboard defines.
	Vars map[string]bool
}

// gridColumns is the width of Grafana's grid.
const gridColumns = 24

type dashJSON struct {
	Title         string      `json:"title"`
	UID           string      `json:"uid"`
	SchemaVersion int         `json:"schemaVersion"`
	Panels        []panelJSON `json:"panels"`
	Templating    struct {
		List []varJSON `json:"list"`
	} `json:"templating"`
}

type panelJSON struct {
	ID         *int            `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	// Panels are the panels of a collapsed row.
	Panels []panelJSON `json:"panels"`
}

type varJSON struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// ParseDashboard reads a Grafana dashboard (the JSON model, as exported
// for sharing) and checks its structure: a title and uid, panels with
// unique ids, a type, a title and a place on the grid, a data source and
// PromQL targets with unique refIds on every panel that queries, and
// template variables with names.
func ParseDashboard(b []byte) (*Dashboard, error) {
	var dj dashJSON
	if err := json.Unmarshal(b, &dj); err != nil {
		return nil, fmt.Errorf("parsing the dashboard: %w", err)
	}
	var errs []error
	if dj.Title == "" || dj.UID == "" {
		errs = append(errs, errors.New("dashboard: title and uid are required"))
	}
	if dj.SchemaVersion <= 0 {
		errs = append(errs, errors.New("dashboard: schemaVersion is missing"))
	}
	d := &Dashboard{Title: dj.Title, UID: dj.UID, Vars: map[string]bool{}}
	for i, v := range dj.Templating.List {
		if !validIdent(v.Name) {
			errs = append(errs, fmt.Errorf("template variable %d: bad name %q", i, v.Name))
			continue
		}
		if d.Vars[v.Name] {
			errs = append(errs, fmt.Errorf("template variable %s defined twice", v.Name))
		}
		d.Vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		q, err := varQuery(v.Query)
		if err != nil {
			errs = append(errs, fmt.Errorf("template variable %s: %w", v.Name, err))
			continue
		}
		if q != "" {
			d.Queries = append(d.Queries, Query{Where: "template variable " + v.Name, Expr: q})
		}
	}
	ids := map[int]bool{}
	var walk func(ps []panelJSON)
	walk = func(ps []panelJSON) {
		for _, p := range ps {
			d.Panels++
			where := fmt.Sprintf("panel %q", p.Title)
			if p.ID == nil {
				errs = append(errs, fmt.Errorf("%s: no id", where))
			} else {
				where = fmt.Sprintf("panel %d %q", *p.ID, p.Title)
				if ids[*p.ID] {
					errs = append(errs, fmt.Errorf("%s: id used twice", where))
				}
				ids[*p.ID] = true
			}
			if p.Type == "" || p.Title == "" {
				errs = append(errs, fmt.Errorf("%s: type and title are required", where))
			}
			if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > gridColumns {
				errs = append(errs, fmt.Errorf("%s: gridPos missing or off the %d-column grid", where, gridColumns))
			}
			walk(p.Panels)
			if p.Type == "row" || p.Type == "text" {
				continue
			}
			if len(p.Datasource) == 0 || string(p.Datasource) == "null" {
				errs = append(errs, fmt.Errorf("%s: no datasource", where))
			}
			if len(p.Targets) == 0 {
				errs = append(errs, fmt.Errorf("%s: no targets", where))
			}
			refs := map[string]bool{}
			for _, t := range p.Targets {
				if t.RefID == "" || refs[t.RefID] {
					errs = append(errs, fmt.Errorf("%s: target refId %q missing or used twice", where, t.RefID))
				}
				refs[t.RefID] = true
				if strings.TrimSpace(t.Expr) == "" {
					errs = append(errs, fmt.Errorf("%s target %s: no expr", where, t.RefID))
					continue
				}
				d.Queries = append(d.Queries, Query{Where: fmt.Sprintf("%s target %s", where, t.RefID), Expr: t.Expr})
			}
		}
	}
	walk(dj.Panels)
	errs = append(errs, overlaps(dj.Panels)...)
	if d.Panels == 0 {
		errs = append(errs, errors.New("dashboard: no panels"))
	}
	return d, errors.Join(errs...)
}

// overlaps reports panels of one level that cover the same grid cells.
func overlaps(ps []panelJSON) []error {
	var errs []error
	for i, a := range ps {
		for _, b := range ps[i+1:] {
			ga, gb := a.GridPos, b.GridPos
			if ga == nil || gb == nil {
				continue
			}
			if ga.X < gb.X+gb.W && gb.X < ga.X+ga.W && ga.Y < gb.Y+gb.H && gb.Y < ga.Y+ga.H {
				errs = append(errs, fmt.Errorf("panels %q and %q overlap on the grid", a.Title, b.Title))
			}
		}
		errs = append(errs, overlaps(a.Panels)...)
	}
	return errs
}

// labelValuesRE matches Grafana's label_values(metric, label) and
// label_values(label).
var labelValuesRE = regexp.MustCompile(`^\s*label_values\(\s*(?:(.+?)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// varQuery turns a query variable's query (a string, or an object with a
// "query" field) into PromQL: label_values(m, l) is `group by (l) (m)`,
// query_result(e) is e; label_values(l) and metrics(re) name no metric
// ("").
func varQuery(raw json.RawMessage) (string, error) {
	var q string
	if err := json.Unmarshal(raw, &q); err != nil {
		var obj struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			return "", fmt.Errorf("query is neither a string nor an object with a query: %w", err)
		}
		q = obj.Query
	}
	q = strings.TrimSpace(q)
	if m := labelValuesRE.FindStringSubmatch(q); m != nil {
		if m[1] == "" {
			return "", nil
		}
		return fmt.Sprintf("group by (%s) (%s)", m[2], m[1]), nil
	}
	if inner, ok := strings.CutPrefix(q, "query_result("); ok && strings.HasSuffix(inner, ")") {
		return strings.TrimSuffix(inner, ")"), nil
	}
	if strings.HasPrefix(q, "metrics(") || strings.HasPrefix(q, "label_names(") {
		return "", nil
	}
	if q == "" {
		return "", errors.New("empty query")
	}
	return q, nil
}
