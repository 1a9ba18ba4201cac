package main

// Scraping the nodes' Prometheus /metrics (admin_listen): leader changes,
// snapshots and shedding as the nodes count them. The text comes from
// outside kvbench, so the reader is bounded in bytes, line length and
// series, and refuses what it cannot parse (metrics_scrape_test.go feeds
// it malformed input).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Limits of a scrape.
const (
	// metricsBytesMax bounds the exposition read from one node.
	metricsBytesMax = 8 << 20
	// metricsLineBytesMax bounds one line of it.
	metricsLineBytesMax = 64 << 10
	// metricsSeriesMax bounds the series kept from one scrape.
	metricsSeriesMax = 100_000
	// metricsScrapeTimeout bounds one node's scrape; scrapeAttempts is
	// how often scrapeAll tries a node.
	metricsScrapeTimeout = 2 * time.Second
	scrapeAttempts       = 2
)

// Series kvbench reads. A node that does not export one leaves it out
// of the scrape, and the figure it feeds is reported as unknown.
const (
	metricLeaderChanges      = "synod_leader_changes_total"
	metricSnapshots          = "synod_snapshots_total"
	metricSnapshotsInstalled = "synod_snapshots_installed_total"
	// metricSnapshotSeconds is a histogram of how long taking one
	// snapshot took (its _sum and _count are read).
	metricSnapshotSeconds = "synod_snapshot_seconds"
	// metricSnapshotTransferSeconds is a histogram of snapshot
	// transfers to and from peers by direction ("sent", "received": a
	// received one until its state is installed).
	metricSnapshotTransferSeconds = "synod_snapshot_transfer_seconds"
	metricSnapshotReceivedBytes   = "synod_snapshot_received_bytes_total"
	// metricDeltaRanges counts the digest ranges of delta transfers a
	// node installed, by what="kept" or "replaced".
	metricDeltaRanges = "synod_snapshot_delta_ranges_total"
	metricLogUsed     = "synod_acceptor_log_used_bytes"
	metricLogFull     = "synod_log_full_total"
	// metricShed is the overload guard's THROTTLED count by priority.
	metricShed = "synod_overload_shed_total"
)

// histSeries returns the _sum or _count series of histogram name, with
// one label (label "" for none).
func histSeries(name, part, label, value string) string {
	if label == "" {
		return name + "_" + part
	}
	return fmt.Sprintf("%s_%s{%s=%q}", name, part, label, value)
}

// priorityClasses are the overload guard's class labels.
var priorityClasses = []string{"critical", "standard", "bulk"}

// metrics is one scrape: the value of each series, keyed by its name and
// label set exactly as exposed (`name` or `name{k="v",...}`).
type metrics map[string]float64

// get returns a series' value and whether the scrape had it.
func (m metrics) get(series string) (float64, bool) {
	v, ok := m[series]
	return v, ok
}

// parseMetrics reads Prometheus text exposition: comment and blank lines
// are skipped; every other line is `series value [timestamp]`. It fails
// on a line it cannot parse, one longer than metricsLineBytesMax, input
// beyond metricsBytesMax or more than metricsSeriesMax series.
func parseMetrics(r io.Reader) (metrics, error) {
	lr := &io.LimitedReader{R: r, N: metricsBytesMax + 1}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 4096), metricsLineBytesMax)
	out := metrics{}
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || text[0] == '#' {
			continue
		}
		series, rest, err := splitSeries(text)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", line, err)
		}
		fields := strings.Fields(rest)
		if len(fields) < 1 || len(fields) > 2 {
			return nil, fmt.Errorf("metrics line %d: want a value and at most a timestamp after %q", line, series)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: value %q: %w", line, fields[0], err)
		}
		if _, dup := out[series]; !dup && len(out) >= metricsSeriesMax {
			return nil, fmt.Errorf("metrics: more than %d series", metricsSeriesMax)
		}
		out[series] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if lr.N <= 0 {
		return nil, fmt.Errorf("metrics: more than %d bytes", metricsBytesMax)
	}
	return out, nil
}

// splitSeries splits a sample line into its series (name and label set)
// and the rest. Label values are quoted and may hold spaces, braces and
// escaped quotes.
func splitSeries(line string) (series, rest string, err error) {
	i := 0
	for i < len(line) && line[i] != '{' && line[i] != ' ' && line[i] != '\t' {
		c := line[i]
		if !(c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return "", "", fmt.Errorf("byte %q in a metric name", c)
		}
		i++
	}
	if i == 0 {
		return "", "", errors.New("no metric name")
	}
	if i == len(line) {
		return "", "", errors.New("no value")
	}
	if line[i] != '{' {
		return line[:i], line[i:], nil
	}
	inQuote := false
	for j := i + 1; j < len(line); j++ {
		switch c := line[j]; {
		case inQuote && c == '\\':
			j++ // the escaped byte
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return line[:j+1], line[j+1:], nil
		}
	}
	return "", "", errors.New("unterminated label set")
}

// scrapeMetrics fetches and parses one node's /metrics.
func scrapeMetrics(ctx context.Context, adminAddr string) (metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, metricsScrapeTimeout)
	defer cancel()
	resp, err := adminGet(ctx, adminAddr, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", adminAddr, err)
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body)
}

// adminGet GETs path from an embedded node's admin endpoint with
// kvbench's admin token; an answer other than 200 OK is an error (its
// body closed).
func adminGet(ctx context.Context, adminAddr, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+adminAddr+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+benchAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", path, resp.Status)
	}
	return resp, nil
}

// scrapeAll scrapes every node of c; a node that does not answer twice
// (a busy leader on a starved machine can miss one timeout) is nil.
func (c *cluster) scrapeAll(ctx context.Context) []metrics {
	out := make([]metrics, len(c.admins))
	for i, a := range c.admins {
		for range scrapeAttempts {
			if m, err := scrapeMetrics(ctx, a); err == nil {
				out[i] = m
				break
			}
		}
	}
	return out
}
