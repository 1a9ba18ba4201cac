// Package deploy is the operator's kit for running kvnode, and the checks
// that keep it honest:
//
//	grafana/synod.json          a Grafana dashboard over kvnode's /metrics
//	prometheus/alerts.yml       alert rules
//	prometheus/prometheus.yml   a scrape config for a 3-node cluster
//	systemd/kvnode.service      a hardened systemd unit
//
// The Go code reads those files: ParseDashboard and ParseRules check their
// structure and return every PromQL expression in them; ParseExpr pulls
// the metric and label names out of an expression; Exposition.Check holds
// them against what a running node exported (e2e/deploy_test.go scrapes a
// real kvnode); ParseUnit reads the systemd unit. deploy_test.go tests the
// checker on planted mistakes, checks the files' structure, and runs
// promtool and systemd-analyze on them when they are installed (README.md
// in this folder).
package deploy
