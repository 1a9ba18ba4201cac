package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The kit's files, relative to this package.
const (
	dashboardPath  = "grafana/synod.json"
	alertsPath     = "prometheus/alerts.yml"
	alertTestsPath = "prometheus/alerts_test.yml"
	scrapePath     = "prometheus/prometheus.yml"
	unitPath       = "systemd/kvnode.service"
)

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loadExposition(t testing.TB) *Exposition {
	t.Helper()
	f, err := os.Open("testdata/exposition.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e, err := ParseExposition(f)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestParseExpr(t *testing.T) {
	cases := []struct {
		expr     string
		metrics  []string
		grouping []string
		matched  map[string][]string
		vars     []string
	}{
		{expr: `up`, metrics: []string{"up"}},
		{expr: `rate(synod_leader_changes_total[5m])`, metrics: []string{"synod_leader_changes_total"}},
		{
			expr:     `histogram_quantile(0.99, sum by (le, instance) (rate(synod_commit_latency_seconds_bucket{job="$job",instance=~"$instance"}[$__rate_interval])))`,
			metrics:  []string{"synod_commit_latency_seconds_bucket"},
			grouping: []string{"le", "instance"},
			matched:  map[string][]string{"synod_commit_latency_seconds_bucket": {"job", "instance"}},
			vars:     []string{"job", "instance", "__rate_interval"},
		},
		{
			// Aggregation clause after the arguments, keywords in capitals,
			// a binary operator with matching and grouping.
			expr:     `SUM(rate(a_total[1m])) BY (tenant) / ON (tenant) GROUP_LEFT (priority) b_info{priority="critical"} > BOOL 0`,
			metrics:  []string{"a_total", "b_info"},
			grouping: []string{"tenant", "priority"},
			matched:  map[string][]string{"b_info": {"priority"}},
		},
		{
			expr:     `max by (job) (c) - on (job) group_right d > 20000 and e offset 5m unless f @ end()`,
			metrics:  []string{"c", "d", "e", "f"},
			grouping: []string{"job"},
		},
		{
			// Numbers and durations are no metrics; neither are strings
			// or a Grafana variable outside a string.
			expr:    `histogram_quantile($quantile, x_bucket) * 1e-3 + 0x1F - .5 + Inf`,
			metrics: []string{"x_bucket"},
			vars:    []string{"quantile"},
		},
		{
			expr:    `{__name__="g", tenant!~"a|b"}`,
			metrics: []string{"g"},
			matched: map[string][]string{"g": {"tenant"}},
		},
		{
			expr:    "label_replace(h, \"dst\", \"$1\", \"src\", \"(.*)\") # a comment naming not_a_metric\n",
			metrics: []string{"h"},
		},
		{
			expr:    `max_over_time(rate(i_total[5m])[1h:1m]) and ${job:csv} == ${job}`,
			metrics: []string{"i_total"},
			vars:    []string{"job"},
		},
		{expr: `count_values("v", j) and topk(3, k) and quantile(0.5, l)`, metrics: []string{"j", "k", "l"}},
	}
	for _, c := range cases {
		x, err := ParseExpr(c.expr)
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		if !slices.Equal(x.Metrics, c.metrics) {
			t.Errorf("%s: metrics %q, want %q", c.expr, x.Metrics, c.metrics)
		}
		if !slices.Equal(x.Grouping, c.grouping) {
			t.Errorf("%s: grouping %q, want %q", c.expr, x.Grouping, c.grouping)
		}
		for m, want := range c.matched {
			if !slices.Equal(x.Matched[m], want) {
				t.Errorf("%s: labels matched on %s: %q, want %q", c.expr, m, x.Matched[m], want)
			}
		}
		if !slices.Equal(x.Vars, c.vars) {
			t.Errorf("%s: vars %q, want %q", c.expr, x.Vars, c.vars)
		}
	}
	x, _ := ParseExpr(`count_values("v", j) by (v)`)
	if x == nil || !slices.Contains(x.Created, "v") {
		t.Errorf("count_values's label not recorded as created: %+v", x)
	}
}

func TestParseExprRefusesBrokenExpressions(t *testing.T) {
	for expr, want := range map[string]string{
		``:                                  "empty",
		`rate(a[5m]`:                        "unclosed",
		`rate(a[5m]))`:                      "unbalanced",
		`rat(a[5m])`:                        "unknown function rat",
		`sum by (job (a)`:                   "unexpected",
		`a{job="x}`:                         "unterminated",
		`a{job}`:                            "without a matcher",
		`a{job=x}`:                          "not a string",
		`a{__name__=~"b.*"}`:                "regex",
		`rate(a[5m)`:                        "unterminated '['",
		`rate(a[5m)])`:                      "malformed range",
		`rate(a[])`:                         "malformed range",
		`rate(a[[interval]])`:               "malformed range",
		`a ~ b`:                             "unexpected",
		`sum`:                               "no arguments",
		`sum a`:                             "not followed by its arguments",
		`a and $`:                           "without a variable name",
		`a by (job)`:                        "", // grammar beyond the tokenizer: promtool's part
		"a{job=\"x\n\"}":                    "newline",
		`histogram_quantile(0.9, sum(x)) )`: "unbalanced",
	} {
		_, err := ParseExpr(expr)
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", expr, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%q: error %v, want one saying %q", expr, err, want)
		}
	}
}

func TestParseExposition(t *testing.T) {
	e := loadExposition(t)
	for _, n := range []string{"synod_commit_latency_seconds_bucket", "synod_commit_latency_seconds_sum",
		"synod_commit_latency_seconds_count", "synod_tenant_info", "process_resident_memory_bytes"} {
		if !e.Has(n) {
			t.Errorf("%s not found in %v", n, e.Names())
		}
	}
	if e.Has("synod_commit_latency_seconds") {
		t.Error("a histogram's family name counted as a sample")
	}
	if !e.samples["synod_tenant_info"]["priority"] {
		t.Error("label priority of synod_tenant_info not recorded")
	}
	if _, err := ParseExposition(strings.NewReader("# only comments\n")); err == nil {
		t.Error("an exposition without samples was accepted")
	}
	if _, err := ParseExposition(strings.NewReader("a{b=\"c} 1\n")); err == nil {
		t.Error("an unterminated label value was accepted")
	}
}

// TestCheckerCatchesPlantedDashboard: a dashboard with one misspelled
// metric among good queries; the checker must name that metric, with the
// exported name it is closest to, and nothing else.
func TestCheckerCatchesPlantedDashboard(t *testing.T) {
	e := loadExposition(t)
	d, err := ParseDashboard(readFile(t, "testdata/planted-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	for _, q := range d.Queries {
		for _, err := range e.Check(q.Expr, d.Vars) {
			problems = append(problems, q.Where+": "+err.Error())
		}
	}
	if len(problems) != 1 || !strings.Contains(problems[0], `panel 3 "Misspelled" target A`) ||
		!strings.Contains(problems[0], "metric synod_comit_latency_seconds_bucket is not exported") ||
		!strings.Contains(problems[0], "did you mean synod_commit_latency_seconds_bucket") {
		t.Fatalf("the planted misspelling was not reported alone:\n%s", strings.Join(problems, "\n"))
	}
	t.Logf("caught: %s", problems[0])
}

// TestCheckerCatchesPlantedMistakes: each expression holds one mistake
// the checker must report.
func TestCheckerCatchesPlantedMistakes(t *testing.T) {
	e := loadExposition(t)
	vars := map[string]bool{"job": true}
	for expr, want := range map[string]string{
		`synod_commit_latency_seconds`:                           "a histogram: use synod_commit_latency_seconds_bucket",
		`rate(synod_leader_change_total[5m])`:                    "did you mean synod_leader_changes_total",
		`synod_tenant_info{tenant_name="alpha"}`:                 "has no label tenant_name",
		`sum by (tenat) (synod_tenant_info)`:                     "grouping label tenat",
		`synod_is_leader{job="$cluster"}`:                        "template variable $cluster is not defined",
		`vector(1)`:                                              "names no metric",
		`sum(rate(synod_tenant_throttled_total[5m])) by (reasn)`: "grouping label reasn",
	} {
		errs := e.Check(expr, vars)
		found := false
		for _, err := range errs {
			found = found || strings.Contains(err.Error(), want)
		}
		if !found {
			t.Errorf("%s: errors %v, want one saying %q", expr, errs, want)
		}
	}
	// And the same checker passes what is right.
	for _, expr := range []string{
		`up{job="$job"} == 0`,
		`synod_is_leader{job="$job", instance=~".*"}`,
		`sum by (job, instance, tenant) (rate(synod_tenant_throttled_total[5m])) * on (job, instance, tenant) group_left (priority) synod_tenant_info{priority="critical"}`,
		`label_replace(synod_is_leader, "node", "$1", "instance", "(.*):.*") and on (node) synod_is_leader`,
	} {
		if errs := e.Check(expr, vars); len(errs) > 0 {
			t.Errorf("%s: %v", expr, errs)
		}
	}
}

func TestDashboard(t *testing.T) {
	d, err := ParseDashboard(readFile(t, dashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Queries) < 20 {
		t.Fatalf("only %d queries", len(d.Queries))
	}
	// What issue 16 asks the dashboard to show, by the metric that shows it.
	want := map[string]string{
		"commit latency":         "synod_commit_latency_seconds_bucket",
		"latency by stage":       "synod_write_stage_seconds_bucket",
		"leader":                 "synod_leader_id",
		"ballot":                 "synod_promised_ballot_round",
		"leader changes":         "synod_leader_changes_total",
		"tenant ops":             "synod_tenant_ops_total",
		"tenant throttles":       "synod_tenant_throttled_total",
		"tenant latency":         "synod_tenant_latency_seconds_bucket",
		"log use":                "synod_acceptor_log_used_bytes",
		"snapshot progress":      "synod_snapshot_slot",
		"RSS":                    "process_resident_memory_bytes",
		"read barrier latency":   "synod_read_barrier_latency_seconds_bucket",
		"overload shedding":      "synod_overload_shed_total",
		"snapshots installed":    "synod_snapshots_installed_total",
		"follower lag (applied)": "synod_applied_slot",
	}
	used := map[string]bool{}
	for _, q := range d.Queries {
		x, err := ParseExpr(q.Expr)
		if err != nil {
			t.Errorf("%s: %v", q.Where, err)
			continue
		}
		for _, m := range x.Metrics {
			used[m] = true
		}
		for _, v := range x.Vars {
			if !d.Vars[v] && !grafanaBuiltins[v] {
				t.Errorf("%s: template variable $%s is not defined", q.Where, v)
			}
		}
	}
	for what, m := range want {
		if !used[m] {
			t.Errorf("no panel shows %s (%s)", what, m)
		}
	}
	t.Logf("dashboard %q: %d panels, %d queries, %d metrics", d.Title, d.Panels, len(d.Queries), len(used))
}

func TestDashboardStructureErrors(t *testing.T) {
	for name, body := range map[string]string{
		"not json":  `{`,
		"no title":  `{"uid":"x","schemaVersion":39,"panels":[{"id":1,"type":"text","title":"t","gridPos":{"h":1,"w":1,"x":0,"y":0}}]}`,
		"no panels": `{"title":"x","uid":"x","schemaVersion":39,"panels":[]}`,
		"duplicate id": `{"title":"x","uid":"x","schemaVersion":39,"panels":[{"id":1,"type":"text","title":"a","gridPos":{"h":1,"w":1,"x":0,"y":0}},` +
			`{"id":1,"type":"text","title":"b","gridPos":{"h":1,"w":1,"x":0,"y":1}}]}`,
		"off the grid": `{"title":"x","uid":"x","schemaVersion":39,"panels":[{"id":1,"type":"text","title":"a","gridPos":{"h":1,"w":20,"x":8,"y":0}}]}`,
		"overlap": `{"title":"x","uid":"x","schemaVersion":39,"panels":[{"id":1,"type":"text","title":"a","gridPos":{"h":2,"w":8,"x":0,"y":0}},` +
			`{"id":2,"type":"text","title":"b","gridPos":{"h":2,"w":8,"x":4,"y":1}}]}`,
		"no targets": `{"title":"x","uid":"x","schemaVersion":39,"panels":[{"id":1,"type":"timeseries","title":"a","datasource":{"uid":"p"},` +
			`"gridPos":{"h":1,"w":1,"x":0,"y":0}}]}`,
		"no datasource": `{"title":"x","uid":"x","schemaVersion":39,"panels":[{"id":1,"type":"timeseries","title":"a",` +
			`"gridPos":{"h":1,"w":1,"x":0,"y":0},"targets":[{"refId":"A","expr":"up"}]}]}`,
		"same refId": `{"title":"x","uid":"x","schemaVersion":39,"panels":[{"id":1,"type":"timeseries","title":"a","datasource":{"uid":"p"},` +
			`"gridPos":{"h":1,"w":1,"x":0,"y":0},"targets":[{"refId":"A","expr":"up"},{"refId":"A","expr":"up"}]}]}`,
	} {
		if _, err := ParseDashboard([]byte(body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// requiredAlerts are the alerts issue 16 asks for.
var requiredAlerts = []string{"SynodNoLeader", "SynodFrequentLeaderChanges", "SynodAcceptorLogNearlyFull",
	"SynodFollowerLag", "SynodCriticalTenantThrottled"}

func TestAlertRules(t *testing.T) {
	rf, qs, err := ParseRules(readFile(t, alertsPath))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			have[r.Alert] = true
		}
	}
	for _, a := range requiredAlerts {
		if !have[a] {
			t.Errorf("alert %s is missing", a)
		}
	}
	for _, q := range qs {
		x, _ := ParseExpr(q.Expr)
		if len(x.Vars) > 0 {
			t.Errorf("%s: template variables %v in an alert", q.Where, x.Vars)
		}
	}
	t.Logf("%d alert rules", len(qs))
}

func TestAlertRulesStructureErrors(t *testing.T) {
	const good = `groups:
  - name: g
    rules:
      - alert: A
        expr: up == 0
        for: 1m
        labels: {severity: warning}
        annotations: {summary: "s {{ $labels.instance }}", description: "d {{ $value | humanize }}"}
`
	if _, _, err := ParseRules([]byte(good)); err != nil {
		t.Fatalf("the good file: %v", err)
	}
	for name, edit := range map[string][2]string{
		"unknown key":        {"expr:", "exprr:"},
		"bad duration":       {"for: 1m", "for: 1 minute"},
		"no severity":        {"{severity: warning}", "{team: db}"},
		"bad severity":       {"severity: warning", "severity: page"},
		"no description":     {`, description: "d {{ $value | humanize }}"`, ""},
		"broken template":    {"{{ $labels.instance }}", "{{ $labels.instance }"},
		"unknown function":   {"humanize }}", "humanise }}"},
		"record and alert":   {"- alert: A", "- alert: A\n        record: a:b"},
		"bad expr":           {"up == 0", "rate(up[5m]"},
		"no groups":          {"groups:\n  - name: g\n    rules:", "groups: []\nx:"},
		"bad alert name":     {"alert: A", "alert: A-B"},
		"group without name": {"name: g", "name: \"\""},
	} {
		bad := strings.Replace(good, edit[0], edit[1], 1)
		if bad == good {
			t.Fatalf("%s: the edit changed nothing", name)
		}
		if _, _, err := ParseRules([]byte(bad)); err == nil {
			t.Errorf("%s: accepted\n%s", name, bad)
		}
	}
}

// TestCheckerCatchesPlantedAlert: an alert rule whose expression names a
// metric the node does not export.
func TestCheckerCatchesPlantedAlert(t *testing.T) {
	e := loadExposition(t)
	_, qs, err := ParseRules([]byte(`groups:
  - name: planted
    rules:
      - alert: Planted
        expr: max by (job) (synod_is_leadr) < 1
        labels: {severity: critical}
        annotations: {summary: s, description: d}
`))
	if err != nil {
		t.Fatal(err)
	}
	errs := e.Check(qs[0].Expr, nil)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "synod_is_leadr is not exported") {
		t.Fatalf("planted alert: %v", errs)
	}
}

// needTool returns the path of a tool the test runs, skipping the test
// when it is missing, or failing it under CI=true, where scripts/test.sh
// installs it (prometheus for promtool, systemd for systemd-analyze).
func needTool(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not installed (CI=true): run scripts/test.sh or apt-get install %s", name, pkg)
		}
		t.Skipf("%s not installed: apt-get install %s", name, pkg)
	}
	return p
}

// toolTimeout bounds one run of promtool or systemd-analyze (a loaded
// 2-core machine may be slow to start them).
const toolTimeout = 2 * time.Minute

func runTool(t testing.TB, dir, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	done := make(chan struct{})
	timer := time.AfterFunc(toolTimeout, func() {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
		close(done)
	})
	out, err := cmd.CombinedOutput()
	if !timer.Stop() {
		<-done
		return string(out), fmt.Errorf("%s timed out after %v", name, toolTimeout)
	}
	return string(out), err
}

// TestPromtool checks the rule file, runs its unit tests
// (alerts_test.yml), checks the scrape config, and checks every dashboard
// expression as PromQL (Grafana's variables replaced by values); a
// planted syntax error must fail.
func TestPromtool(t *testing.T) {
	promtool := needTool(t, "promtool", "prometheus")
	// promtool reads alerts_test.yml in a child process: read it here too,
	// so that go test's cache notices an edit of it.
	readFile(t, alertTestsPath)
	if out, err := runTool(t, "prometheus", promtool, "check", "rules", "alerts.yml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := runTool(t, "prometheus", promtool, "test", "rules", "alerts_test.yml"); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	// The scrape config names files that exist only on a Prometheus
	// server: point them at stand-ins.
	dir := t.TempDir()
	tokenFile, rulesFile := filepath.Join(dir, "token"), filepath.Join(dir, "alerts.yml")
	os.WriteFile(tokenFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
	os.WriteFile(rulesFile, readFile(t, alertsPath), 0o600)
	cfg := strings.NewReplacer("/etc/prometheus/synod-admin-token", tokenFile, "/etc/prometheus/synod-alerts.yml", rulesFile).
		Replace(string(readFile(t, scrapePath)))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runTool(t, dir, promtool, "check", "config", "prometheus.yml"); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}

	d, err := ParseDashboard(readFile(t, dashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	// Every variable the dashboard uses, as a value PromQL accepts where
	// the dashboard puts it.
	subst := strings.NewReplacer("$__rate_interval", "5m", "$quantile", "0.99", "$job", "synod", "$instance", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range d.Queries {
		expr := subst.Replace(q.Expr)
		if strings.Contains(expr, "$") {
			t.Fatalf("%s: a template variable this test does not replace: %s", q.Where, expr)
		}
		fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", i, strconv.Quote(expr))
	}
	check := func(name, body string) (string, error) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return runTool(t, dir, promtool, "check", "rules", name)
	}
	if out, err := check("dashboard.yml", rules.String()); err != nil {
		t.Fatalf("the dashboard's queries as recording rules: %v\n%s", err, out)
	}
	// The same check fails on a planted syntax error (it is not a check
	// that passes anything).
	planted := "groups:\n  - name: planted\n    rules:\n      - record: planted:x\n        expr: \"sum by (job) (rate(up[5m])\"\n"
	if out, err := check("planted.yml", planted); err == nil {
		t.Fatalf("promtool accepted a planted syntax error:\n%s", out)
	}
	t.Logf("promtool: rules, rule unit tests, scrape config and %d dashboard queries pass", len(d.Queries))
}

func TestSystemdUnit(t *testing.T) {
	raw := readFile(t, unitPath)
	u, err := ParseUnit(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Type": "exec", "User": "synod", "Group": "synod", "RemoveIPC": "no", "ProtectSystem": "strict",
		"ProtectHome": "yes", "NoNewPrivileges": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes",
		"CapabilityBoundingSet": "", "AmbientCapabilities": "", "Restart": "on-failure", "StateDirectory": "synod",
		"ConfigurationDirectory": "synod", "KillSignal": "SIGTERM",
	}
	for k, v := range want {
		got, ok := u.Get("Service", k)
		if !ok || got != v {
			t.Errorf("[Service] %s=%q (set %v), want %q", k, got, ok, v)
		}
	}
	if _, ok := u.Get("Service", "DynamicUser"); ok {
		t.Error("DynamicUser implies RemoveIPC=yes, which deletes an shm-mode acceptor log when the unit stops")
	}
	if exec, _ := u.Get("Service", "ExecStart"); !strings.Contains(exec, "kvnode --config /etc/synod/") {
		t.Errorf("ExecStart=%s", exec)
	}
	if len(u["Service"]["ReadWritePaths"]) == 0 {
		t.Error("no ReadWritePaths for a pmem path outside the state directory")
	}
	if w, _ := u.Get("Install", "WantedBy"); w != "multi-user.target" {
		t.Errorf("[Install] WantedBy=%s", w)
	}

	// TimeoutStopSec lets kvnode's own shutdown bound run out first.
	stop, _ := u.Get("Service", "TimeoutStopSec")
	stopD, err := time.ParseDuration(stop)
	if err != nil {
		t.Fatalf("TimeoutStopSec=%s: %v", stop, err)
	}
	bound := kvnodeShutdownTimeout(t)
	if stopD <= bound || stopD > 3*bound {
		t.Errorf("TimeoutStopSec=%v, want a little more than kvnode's shutdownTimeout (%v)", stopD, bound)
	}

	// Open files: client connections (conns_max + conns_unauthenticated_max
	// by default), side channel, Pebble's table cache, with room to raise
	// conns_max.
	nofile, _ := u.Get("Service", "LimitNOFILE")
	if n, err := strconv.Atoi(nofile); err != nil || n < 16384 {
		t.Errorf("LimitNOFILE=%s, want at least 16384", nofile)
	}

	// The commented guidance: CPUAffinity for [cores], the AF_XDP
	// variant.
	text := string(raw)
	for _, line := range []string{
		"#CPUAffinity=", "[cores]",
		"#CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW CAP_BPF CAP_IPC_LOCK",
		"#AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW CAP_BPF CAP_IPC_LOCK",
		"#LimitMEMLOCK=infinity", "#RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_XDP AF_NETLINK",
		"#SystemCallFilter=bpf",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("the unit lacks %q", line)
		}
	}
	v, err := ParseUnit([]byte(afxdpVariant(text)))
	if err != nil {
		t.Fatal(err)
	}
	if caps, _ := v.Get("Service", "AmbientCapabilities"); !strings.Contains(caps, "CAP_BPF") {
		t.Errorf("the AF_XDP variant's AmbientCapabilities=%s", caps)
	}
	if m, _ := v.Get("Service", "LimitMEMLOCK"); m != "infinity" {
		t.Errorf("the AF_XDP variant's LimitMEMLOCK=%s", m)
	}
}

// afxdpVariant uncomments the unit's AF_XDP block (what a drop-in for an
// AF_XDP node sets).
func afxdpVariant(unit string) string {
	_, block, _ := strings.Cut(unit, "# --- transport \"afxdp\"")
	block, _, _ = strings.Cut(block, "[Install]")
	var b strings.Builder
	for _, l := range strings.Split(block, "\n") {
		if strings.HasPrefix(l, "#") && strings.Contains(l, "=") && !strings.HasPrefix(l, "# ") {
			b.WriteString(l[1:] + "\n")
		}
	}
	return strings.Replace(unit, "[Install]", b.String()+"\n[Install]", 1)
}

// kvnodeShutdownTimeout reads shutdownTimeout from cmd/kvnode/serve.go,
// so that the unit's TimeoutStopSec follows it.
func kvnodeShutdownTimeout(t testing.TB) time.Duration {
	t.Helper()
	src := string(readFile(t, "../cmd/kvnode/serve.go"))
	m := regexp.MustCompile(`(?m)^const shutdownTimeout = (\d+) \* time\.Second`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("shutdownTimeout not found in cmd/kvnode/serve.go")
	}
	n, _ := strconv.Atoi(m[1])
	return time.Duration(n) * time.Second
}

// TestSystemdAnalyze runs systemd-analyze verify on the unit and its
// AF_XDP variant (any warning fails), and requires an exposure of at most
// 2.0 from systemd-analyze security.
func TestSystemdAnalyze(t *testing.T) {
	sa := needTool(t, "systemd-analyze", "systemd")
	// verify checks that ExecStart's binary exists: point it at one that
	// does.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit := strings.ReplaceAll(string(readFile(t, unitPath)), "/usr/local/bin/kvnode", exe)
	for name, body := range map[string]string{"plain": unit, "afxdp": afxdpVariant(unit)} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "kvnode.service"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := runTool(t, dir, sa, "verify", "--man=no", "./kvnode.service")
		if err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("%s unit: systemd-analyze verify: %v\n%s", name, err, out)
		}
		if name != "plain" {
			continue
		}
		// A bad directive must show (verify exits 0 on warnings).
		bad := strings.Replace(body, "\nProtectSystem=strict\n", "\nProtectSystem=strickt\n", 1)
		os.WriteFile(filepath.Join(dir, "kvnode.service"), []byte(bad), 0o644)
		if out, _ := runTool(t, dir, sa, "verify", "--man=no", "./kvnode.service"); !strings.Contains(out, "strickt") {
			t.Errorf("systemd-analyze verify did not report a planted bad value:\n%s", out)
		}
		os.WriteFile(filepath.Join(dir, "kvnode.service"), []byte(body), 0o644)
		out, err = runTool(t, dir, sa, "security", "--offline=yes", "./kvnode.service")
		m := regexp.MustCompile(`Overall exposure level for kvnode\.service: ([0-9.]+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("systemd-analyze security: %v\n%s", err, out)
		}
		if x, _ := strconv.ParseFloat(m[1], 64); x > 2.0 {
			t.Errorf("exposure level %s, want at most 2.0:\n%s", m[1], out)
		}
		t.Logf("systemd-analyze security: exposure %s", m[1])
	}
}
