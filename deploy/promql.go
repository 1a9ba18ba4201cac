package deploy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Expr is what a PromQL expression names: the metrics it selects and the
// labels it refers to. ParseExpr fills it in without evaluating anything.
type Expr struct {
	// Metrics are the metric names the expression selects, each once, in
	// order of first use, exactly as written (a histogram's series keep
	// their _bucket, _sum or _count suffix).
	Metrics []string
	// Matched maps a metric name to the label names its selector matches
	// on ({tenant="x"}); a selector without a metric name is under "".
	Matched map[string][]string
	// Grouping are the label names of by, without, on, ignoring,
	// group_left and group_right lists.
	Grouping []string
	// Created are label names the expression makes itself
	// (label_replace, label_join, count_values), so that grouping by them
	// is no error.
	Created []string
	// Vars are the Grafana template variables used ($name, ${name},
	// [[name]] is not supported), each once.
	Vars []string
}

// exprBytesMax bounds an expression ParseExpr accepts.
const exprBytesMax = 64 << 10

// ParseExpr extracts the metric and label names of a PromQL expression,
// which may hold Grafana template variables ($__rate_interval, $instance,
// ${job}). It is a tokenizer, not a full parser: it checks that brackets
// balance, strings end, selectors are well formed and every function is a
// PromQL function, and leaves the rest of the grammar to Prometheus
// (promtool check rules, when installed, checks that too).
func ParseExpr(expr string) (*Expr, error) {
	if len(expr) > exprBytesMax {
		return nil, fmt.Errorf("expression of %d bytes, at most %d", len(expr), exprBytesMax)
	}
	p := &exprParser{s: expr, e: &Expr{Matched: map[string][]string{}}}
	if err := p.run(); err != nil {
		return nil, fmt.Errorf("at byte %d: %w", p.i, err)
	}
	if strings.TrimSpace(expr) == "" {
		return nil, errors.New("empty expression")
	}
	return p.e, nil
}

// frame is one open parenthesis: the function or aggregation it calls
// ("" for a plain group) and which of its arguments the parser is in.
type frame struct {
	fn  string
	arg int
}

type exprParser struct {
	s     string
	i     int
	e     *Expr
	stack []frame
	// pendingFn is an aggregation or function whose '(' has not come yet
	// (sum by (x) (...)).
	pendingFn string
	// lastMetric is the metric a following selector belongs to ("" when
	// the previous token was not a metric name).
	lastMetric string
}

func (p *exprParser) run() error {
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			p.i++
			continue
		case c == '#':
			for p.i < len(p.s) && p.s[p.i] != '\n' {
				p.i++
			}
			continue
		case c == '"' || c == '\'' || c == '`':
			v, err := p.str()
			if err != nil {
				return err
			}
			p.stringArg(v)
			p.lastMetric = ""
		case c == '$':
			if err := p.variable(); err != nil {
				return err
			}
			p.lastMetric = ""
		case isDigit(c) || (c == '.' && p.i+1 < len(p.s) && isDigit(p.s[p.i+1])):
			p.number()
			p.lastMetric = ""
		case isIdentStart(c):
			if err := p.ident(); err != nil {
				return err
			}
		case c == '{':
			if err := p.selector(); err != nil {
				return err
			}
			p.lastMetric = ""
		case c == '[':
			end := strings.IndexByte(p.s[p.i:], ']')
			if end < 0 {
				return errors.New("unterminated '['")
			}
			if err := p.rangeVars(p.s[p.i+1 : p.i+end]); err != nil {
				return err
			}
			p.i += end + 1
			p.lastMetric = ""
		case c == '(':
			p.stack = append(p.stack, frame{fn: p.pendingFn})
			p.pendingFn = ""
			p.i++
			p.lastMetric = ""
		case c == ')':
			if len(p.stack) == 0 {
				return errors.New("unbalanced ')'")
			}
			p.stack = p.stack[:len(p.stack)-1]
			p.i++
			p.lastMetric = ""
		case c == ',':
			if len(p.stack) == 0 {
				return errors.New("',' outside a call")
			}
			p.stack[len(p.stack)-1].arg++
			p.i++
			p.lastMetric = ""
		case strings.IndexByte("+-*/%^=!<>@:", c) >= 0:
			p.i++
			p.lastMetric = ""
		default:
			return fmt.Errorf("unexpected %q", c)
		}
		if p.pendingFn != "" && !p.awaitingCall() {
			return fmt.Errorf("%s is not followed by its arguments", p.pendingFn)
		}
	}
	if len(p.stack) > 0 {
		return fmt.Errorf("%d unclosed '('", len(p.stack))
	}
	if p.pendingFn != "" {
		return fmt.Errorf("%s has no arguments", p.pendingFn)
	}
	return nil
}

// awaitingCall reports whether the parser may still be between a pending
// aggregation and its '(' (only white space and a by/without clause may
// stand there, and the clause is consumed whole by ident).
func (p *exprParser) awaitingCall() bool {
	rest := strings.TrimLeft(p.s[p.i:], " \t\r\n")
	return rest == "" || rest[0] == '(' || hasKeywordPrefix(rest, "by") || hasKeywordPrefix(rest, "without")
}

func hasKeywordPrefix(s, kw string) bool {
	return len(s) >= len(kw) && strings.EqualFold(s[:len(kw)], kw) && (len(s) == len(kw) || !isIdentChar(s[len(kw)]))
}

// str consumes a string literal and returns its value (escapes are kept
// as written; label names never hold them).
func (p *exprParser) str() (string, error) {
	q := p.s[p.i]
	start := p.i
	p.i++
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '\\' && q != '`':
			p.i += 2
			continue
		case c == q:
			p.i++
			v := p.s[start+1 : p.i-1]
			return v, p.stringVars(v)
		case c == '\n' && q != '`':
			return "", errors.New("newline in a string")
		}
		p.i++
	}
	p.i = start
	return "", errors.New("unterminated string")
}

// stringArg records a label a function creates from a string argument:
// label_replace(v, "dst", ...), label_join(v, "dst", ...),
// count_values("label", v).
func (p *exprParser) stringArg(v string) {
	if len(p.stack) == 0 {
		return
	}
	f := p.stack[len(p.stack)-1]
	switch {
	case (f.fn == "label_replace" || f.fn == "label_join") && f.arg == 1, f.fn == "count_values" && f.arg == 0:
		p.e.Created = appendOnce(p.e.Created, v)
	}
}

// variable consumes a Grafana template variable: $name or ${name} (with
// an optional :format).
func (p *exprParser) variable() error {
	p.i++ // '$'
	if p.i < len(p.s) && p.s[p.i] == '{' {
		end := strings.IndexByte(p.s[p.i:], '}')
		if end < 0 {
			return errors.New("unterminated ${")
		}
		name, _, _ := strings.Cut(p.s[p.i+1:p.i+end], ":")
		if !validIdent(name) {
			return fmt.Errorf("bad template variable ${%s}", name)
		}
		p.e.Vars = appendOnce(p.e.Vars, name)
		p.i += end + 1
		return nil
	}
	start := p.i
	if p.i < len(p.s) && isIdentStart(p.s[p.i]) && p.s[p.i] != ':' {
		for p.i < len(p.s) && isIdentChar(p.s[p.i]) && p.s[p.i] != ':' {
			p.i++
		}
	}
	if p.i == start {
		return errors.New("'$' without a variable name")
	}
	p.e.Vars = appendOnce(p.e.Vars, p.s[start:p.i])
	return nil
}

// stringVars records the template variables inside a string ("$instance").
func (p *exprParser) stringVars(v string) error {
	for {
		k := strings.IndexByte(v, '$')
		if k < 0 {
			return nil
		}
		sub := &exprParser{s: v[k:], e: p.e}
		if err := sub.variable(); err != nil {
			// A '$' in a regex (end of line) is not a variable.
			v = v[k+1:]
			continue
		}
		v = v[k+sub.i:]
	}
}

// rangeVars checks a range or subquery ([5m], [1h:1m]) and records its
// template variables ([$__rate_interval]).
func (p *exprParser) rangeVars(inner string) error {
	if strings.TrimSpace(inner) == "" || strings.ContainsAny(inner, "[()\"'`") {
		return fmt.Errorf("malformed range [%s]", inner)
	}
	return p.stringVars(inner)
}

// number consumes a number or duration (0.99, 1e-3, 0x1f, 5m, Inf is an
// identifier).
func (p *exprParser) number() {
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		if isIdentChar(c) || c == '.' {
			p.i++
			continue
		}
		if (c == '+' || c == '-') && (p.s[p.i-1] == 'e' || p.s[p.i-1] == 'E') && p.i+1 < len(p.s) && isDigit(p.s[p.i+1]) &&
			!strings.HasPrefix(strings.ToLower(p.s[start:p.i]), "0x") {
			p.i++
			continue
		}
		return
	}
}

// ident consumes an identifier: a keyword, function, aggregation or
// metric name.
func (p *exprParser) ident() error {
	start := p.i
	for p.i < len(p.s) && isIdentChar(p.s[p.i]) {
		p.i++
	}
	id := p.s[start:p.i]
	low := strings.ToLower(id)
	next := p.nextNonSpace()
	p.lastMetric = ""
	switch {
	case low == "by" || low == "without" || low == "on" || low == "ignoring":
		if next != '(' {
			return fmt.Errorf("%s without a label list", id)
		}
		return p.labelList()
	case low == "group_left" || low == "group_right":
		if next == '(' {
			return p.labelList()
		}
		return nil
	case binaryKeywords[low]:
		return nil
	case aggregations[low]:
		p.pendingFn = low
		return nil
	case next == '(':
		if !functions[id] {
			return fmt.Errorf("unknown function %s", id)
		}
		p.pendingFn = id
		return nil
	}
	p.e.Metrics = appendOnce(p.e.Metrics, id)
	p.lastMetric = id
	return nil
}

// nextNonSpace is the next byte that is not white space (0 at the end).
func (p *exprParser) nextNonSpace() byte {
	for j := p.i; j < len(p.s); j++ {
		if c := p.s[j]; c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c
		}
	}
	return 0
}

// labelList consumes "(a, b, ...)" after a grouping keyword.
func (p *exprParser) labelList() error {
	for p.s[p.i] != '(' {
		p.i++
	}
	p.i++
	for {
		c := p.nextNonSpace()
		for p.i < len(p.s) && p.s[p.i] != c {
			p.i++
		}
		switch {
		case c == ')':
			p.i++
			return nil
		case c == ',':
			p.i++
		case isIdentStart(c):
			start := p.i
			for p.i < len(p.s) && isIdentChar(p.s[p.i]) {
				p.i++
			}
			p.e.Grouping = appendOnce(p.e.Grouping, p.s[start:p.i])
		case c == 0:
			return errors.New("unterminated label list")
		default:
			return fmt.Errorf("unexpected %q in a label list", c)
		}
	}
}

// selector consumes "{label op "value", ...}" and records its label names
// under the metric before it; {__name__="m"} selects metric m.
func (p *exprParser) selector() error {
	metric := p.lastMetric
	p.i++ // '{'
	for {
		c := p.nextNonSpace()
		for p.i < len(p.s) && p.s[p.i] != c {
			p.i++
		}
		switch {
		case c == '}':
			p.i++
			return nil
		case c == ',':
			p.i++
			continue
		case c == 0:
			return errors.New("unterminated selector")
		case !isIdentStart(c):
			return fmt.Errorf("unexpected %q in a selector", c)
		}
		start := p.i
		for p.i < len(p.s) && isIdentChar(p.s[p.i]) {
			p.i++
		}
		label := p.s[start:p.i]
		for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
			p.i++
		}
		op := ""
		for _, o := range []string{"=~", "!~", "!=", "="} {
			if strings.HasPrefix(p.s[p.i:], o) {
				op = o
				break
			}
		}
		if op == "" {
			return fmt.Errorf("label %s without a matcher", label)
		}
		p.i += len(op)
		if q := p.nextNonSpace(); q != '"' && q != '\'' && q != '`' {
			return fmt.Errorf("label %s: matcher value is not a string", label)
		}
		for p.s[p.i] != '"' && p.s[p.i] != '\'' && p.s[p.i] != '`' {
			p.i++
		}
		v, err := p.str()
		if err != nil {
			return err
		}
		if label == "__name__" {
			if op != "=" {
				return errors.New("__name__ matched by a regex: the metric names cannot be checked")
			}
			p.e.Metrics = appendOnce(p.e.Metrics, v)
			metric = v
			continue
		}
		p.e.Matched[metric] = appendOnce(p.e.Matched[metric], label)
	}
}

func appendOnce(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdentChar(c byte) bool  { return isIdentStart(c) || isDigit(c) }

func validIdent(s string) bool {
	if s == "" || !isIdentStart(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isIdentChar(s[i]) {
			return false
		}
	}
	return true
}

// binaryKeywords are PromQL keywords that are neither metrics nor calls.
var binaryKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true,
}

// aggregations are PromQL's aggregation operators (case-insensitive).
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

// functions are PromQL's functions (Prometheus 2.x and 3.x), and start()
// and end() of the @ modifier.
var functions = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil
		changes clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week day_of_year days_in_month
		deg delta deriv double_exponential_smoothing end exp floor histogram_avg histogram_count histogram_fraction
		histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta increase info irate
		label_join label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time minute month
		pi predict_linear present_over_time quantile_over_time rad rate resets round scalar sgn sin sinh sort
		sort_by_label sort_by_label_desc sort_desc sqrt start stddev_over_time stdvar_over_time sum_over_time tan tanh
		time timestamp vector year`) {
		functions[f] = true
	}
}
