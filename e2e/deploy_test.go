package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"synod/deploy"
)

// deployAdminToken secures the admin endpoint of TestDeployKitMetricsExported's
// node, as on a real machine (deploy/prometheus/prometheus.yml scrapes
// with it).
const deployAdminToken = "deploy-kit-admin-token-0123456789"

// deployScrapeTimeout bounds one scrape of /metrics.
const deployScrapeTimeout = 10 * time.Second

// TestDeployKitMetricsExported holds the operator's kit against a running
// kvnode: every metric (and label) the Grafana dashboard and the alert
// rules name must be in what the node's /metrics exports, scraped with the
// admin token as Prometheus does. The node serves a few writes and reads
// first, so that the per-tenant series exist.
func TestDeployKitMetricsExported(t *testing.T) {
	dash, err := os.ReadFile("../deploy/grafana/synod.json")
	if err != nil {
		t.Fatal(err)
	}
	d, err := deploy.ParseDashboard(dash)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	_, ruleQueries, err := deploy.ParseRules(rules)
	if err != nil {
		t.Fatal(err)
	}

	c := &cluster{t: t, dir: t.TempDir()}
	mode := c.pmemDir("synod-e2e-deploy-")
	nd := &node{id: 1, client: fmt.Sprintf("127.0.0.1:%d", freePort(t)), consensus: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		admin: fmt.Sprintf("127.0.0.1:%d", freePort(t)), adminToken: deployAdminToken}
	c.nodes = []*node{nd}
	c.writeConfig(nd, 13, mode, fmt.Sprintf("accel = %q\n", nodeAccel(1)), fmt.Sprintf("[admin]\ntoken = %q\n", deployAdminToken),
		[]tenant{tenantA, tenantB, tenantC, tenantBulk, tenantCrit})
	t.Cleanup(func() { c.stopAll(true) })
	c.start(nd)
	c.leader()

	cl := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer cl.Close()
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	for i := 0; i < 20; i++ {
		k := []byte(fmt.Sprintf("deploy-%d", i))
		if err := cl.Put(ctx, k, []byte("v")); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
	}

	req, err := nd.adminRequest(http.MethodGet, "/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: deployScrapeTimeout}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, b)
	}
	exp, err := deploy.ParseExposition(resp.Body)
	if err != nil {
		t.Fatal(err)
	}

	var problems []string
	metrics := map[string]bool{}
	check := func(qs []deploy.Query, vars map[string]bool) {
		for _, q := range qs {
			for _, err := range exp.Check(q.Expr, vars) {
				problems = append(problems, fmt.Sprintf("%s: %v\n    %s", q.Where, err, q.Expr))
			}
			if x, err := deploy.ParseExpr(q.Expr); err == nil {
				for _, m := range x.Metrics {
					metrics[m] = true
				}
			}
		}
	}
	check(d.Queries, d.Vars)
	check(ruleQueries, nil)
	if len(problems) > 0 {
		t.Fatalf("the kit names what the node does not export (%d problems):\n%s", len(problems), strings.Join(problems, "\n"))
	}
	t.Logf("deploy: dashboard queries=%d alert rules=%d metrics=%d exported=%d all-found=true",
		len(d.Queries), len(ruleQueries), len(metrics), len(exp.Names()))
}

// TestDeployReadmeConfigStarts starts kvnode with the config of README.md's
// "Install a 3-node cluster on three machines" (node 1's), its machine
// paths moved to a temporary directory and its LAN addresses to free
// loopback ports, and requires the node to come up and answer /status
// with the admin token from token_file.
func TestDeployReadmeConfigStarts(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(readme), "\n## Install a 3-node cluster on three machines\n")
	if !ok {
		t.Fatal("README.md has no install section")
	}
	_, block, ok := strings.Cut(sec, "```toml\n")
	if !ok {
		t.Fatal("the install section has no toml block")
	}
	block, _, _ = strings.Cut(block, "```")
	var cfg strings.Builder
	for _, l := range strings.Split(block, "\n") {
		cfg.WriteString(strings.TrimPrefix(l, "   ") + "\n")
	}

	c := &cluster{t: t, dir: t.TempDir()}
	nd := &node{id: 1, adminToken: deployAdminToken, logPath: fmt.Sprintf("%s/node1.log", c.dir), cfgPath: fmt.Sprintf("%s/kvnode.toml", c.dir)}
	c.nodes = []*node{nd}
	t.Cleanup(func() { c.stopAll(true) })
	etc, state := c.dir+"/etc", c.dir+"/state"
	if err := os.MkdirAll(etc, 0o750); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(etc+"/secret", []byte(e2eClusterSecret+"\n"), 0o640)
	os.WriteFile(etc+"/admin-token", []byte(deployAdminToken+"\n"), 0o640)
	// A smaller acceptor log than the README's gigabyte: the test checks
	// the config, not the disk.
	repl := []string{"/etc/synod", etc, "/var/lib/synod", state, "size_bytes = 1073741824", "size_bytes = 67108864"}
	for i := 1; i <= 3; i++ {
		ports := [3]int{freePort(t), freePort(t), freePort(t)}
		for j, p := range []string{":7001", ":7011", ":7021"} {
			repl = append(repl, fmt.Sprintf("10.0.0.%d%s", i, p), fmt.Sprintf("127.0.0.1:%d", ports[j]))
		}
		if i == 1 {
			nd.client, nd.consensus, nd.admin = fmt.Sprintf("127.0.0.1:%d", ports[0]),
				fmt.Sprintf("127.0.0.1:%d", ports[1]), fmt.Sprintf("127.0.0.1:%d", ports[2])
		}
	}
	text := strings.NewReplacer(repl...).Replace(cfg.String())
	if strings.Contains(text, "10.0.0.") || !strings.Contains(text, "cluster_secret_file") || !strings.Contains(text, "token_file") ||
		!strings.Contains(text, "size_bytes = 67108864") {
		t.Fatalf("unexpected config in README.md:\n%s", text)
	}
	if err := os.WriteFile(nd.cfgPath, []byte(text), 0o640); err != nil {
		t.Fatal(err)
	}
	c.start(nd) // waits for /status with the token
	st, err := c.status(nd)
	if err != nil || st.Durability != "msync" {
		t.Fatalf("status %+v, %v; want durability msync", st, err)
	}
}
