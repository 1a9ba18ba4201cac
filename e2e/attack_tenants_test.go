package e2e

import (
	"bytes"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"synod/kv/client"
	"synod/kv/proto"
	"synod/tenants"
)

// Several tenants whose clients never read their answers, against the
// real process: the node's response budget keeps a reserve for tenants
// holding little (kv/server/node_reserve.go), so a tenant reading its
// megabyte values one at a time is answered while five others hold the
// rest of the budget in unread answers. Before the reserve, four tenants
// at a quarter of the node's budget each filled it, and the reader's
// GETs were THROTTLED until the flood's connections timed out.
const (
	// unreadLimits: the node's 64 MiB are a reserve of 16 MiB and a
	// shared part of 48 MiB; five tenants of 16 MiB each would fill all
	// 64, and hold at most 5 x 2.1 MiB of the reserve while light (their
	// first answers), which leaves the reader room.
	unreadLimits = "[limits]\nresponse_bytes_per_conn_max = 4194304\nresponse_bytes_per_tenant_max = 16777216\n" +
		"response_bytes_per_node_max = 67108864\nwrite_timeout = \"60s\"\n"
	unreadNodeBytes   = 64 << 20
	unreadSharedBytes = 48 << 20
	unreadFlooders    = 5
	unreadConnsEach   = 5
	unreadValueBytes  = 1_000_000
	unreadReads       = 20
)

func unreadTenants() []tenant {
	var ts []tenant
	for i := 1; i <= unreadFlooders+1; i++ {
		ts = append(ts, tenant{uint32(i), fmt.Sprintf("unread%d", i), fmt.Sprintf("unread-token-%04d", i), ""})
	}
	return ts
}

func unreadTenantsAttack(t *testing.T, _ *cluster, _ *client.Client) string {
	ts := unreadTenants()
	mc := newLimitsClusterOf(t, unreadLimits, ts)
	defer mc.stopAll(false)
	nd := mc.nodes[0]
	key := []byte("big")
	value := bytes.Repeat([]byte("u"), unreadValueBytes)
	for _, tn := range ts {
		cl := dialClient(t, mc.endpoints(), tn.token, killClientRetries)
		ctx, cancel := ctxTimeout(3 * killOpTimeout)
		err := cl.Put(ctx, key, value)
		cancel()
		cl.Close()
		if err != nil {
			return fmt.Sprintf("setting up tenant %s: %v", tn.name, err)
		}
	}
	reader := ts[unreadFlooders]
	rc, br, resp, err := rawDial(nd.client, reader.token, 0)
	if err != nil || resp.Status != proto.StatusOK {
		return fmt.Sprintf("reader: %v %v", resp, err)
	}
	defer rc.Close()
	id := uint64(1)
	// reads has the reader GET its value unreadReads times, one at a
	// time, and returns how long each took, sorted, or why it failed.
	reads := func() ([]time.Duration, string) {
		var took []time.Duration
		for i := 0; i < unreadReads; i++ {
			id++
			start := time.Now()
			rc.SetDeadline(start.Add(connIOTimeout))
			if _, err := rc.Write(proto.AppendRequest(nil, &proto.Request{Op: proto.OpGet, Tenant: tenants.ID(reader.id), ID: id, Key: key})); err != nil {
				return nil, fmt.Sprintf("reader GET %d: %v", i, err)
			}
			r, err := rawRecv(br)
			if err != nil {
				return nil, fmt.Sprintf("reader GET %d: %v", i, err)
			}
			if r.Status != proto.StatusOK || len(r.Value) != unreadValueBytes {
				return nil, fmt.Sprintf("reader GET %d beside %d flooding tenants (node holding %.0f of %d response bytes): %v %q",
					i, unreadFlooders, metricValue(nd, "synod_client_response_bytes"), unreadNodeBytes, r.Status, r.Message)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		return took, ""
	}
	quiet, harm := reads()
	if harm != "" {
		return "before the flood: " + harm
	}
	var conns []net.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	for _, tn := range ts[:unreadFlooders] {
		var frames []byte
		for i := 0; i < proto.InflightPerConnMax; i++ {
			frames = proto.AppendRequest(frames, &proto.Request{Op: proto.OpGet, Tenant: tenants.ID(tn.id), ID: uint64(10 + i), Key: key})
		}
		for i := 0; i < unreadConnsEach; i++ {
			nc, _, resp, err := rawDial(nd.client, tn.token, 0)
			if err != nil || resp.Status != proto.StatusOK {
				return fmt.Sprintf("flood connection of %s: %v %v", tn.name, resp, err)
			}
			conns = append(conns, nc)
			// GETs until the connection is closed, so the budgets stay
			// full however much the kernel's buffers take; never read.
			go func() {
				for {
					if _, err := nc.Write(frames); err != nil {
						return
					}
				}
			}()
		}
	}
	// The flood holds the node's shared part, to within one answer.
	deadline := time.Now().Add(20 * time.Second)
	for metricValue(nd, "synod_client_response_bytes") < unreadSharedBytes-2*unreadValueBytes {
		if time.Now().After(deadline) {
			return fmt.Sprintf("the flood holds %.0f response bytes after 20 s; want the shared part's %d", metricValue(nd, "synod_client_response_bytes"), unreadSharedBytes)
		}
		time.Sleep(50 * time.Millisecond)
	}
	took, harm := reads()
	if harm != "" {
		return harm
	}
	held, peak := metricValue(nd, "synod_client_response_bytes"), metricValue(nd, "synod_client_response_bytes_peak")
	var perTenant []string
	for _, tn := range ts {
		perTenant = append(perTenant, fmt.Sprintf("%s %.1f MiB", tn.name, metricValue(nd, fmt.Sprintf("synod_tenant_response_bytes{tenant=%q}", tn.name))/(1<<20)))
	}
	ms := func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
	t.Logf("unread answers of %d tenants: node holds %.1f MiB (peak %.1f of %d MiB; %v); the reader's %d GETs of %d bytes all answered, median %v and slowest %v (quiet: %v and %v)",
		unreadFlooders, held/(1<<20), peak/(1<<20), unreadNodeBytes>>20, perTenant, unreadReads, unreadValueBytes,
		ms(took[len(took)/2]), ms(took[len(took)-1]), ms(quiet[len(quiet)/2]), ms(quiet[len(quiet)-1]))
	if peak > unreadNodeBytes {
		return fmt.Sprintf("the node held %.0f response bytes, bound %d", peak, unreadNodeBytes)
	}
	return ""
}
