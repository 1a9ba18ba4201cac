package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"synod/kv/client"
	"synod/kv/sm"
)

// tenantQuota stores at most 256 KiB (quota_bytes).
var tenantQuota = tenant{6, "capped", "capped-token-000006", "quota_bytes = 262144\n"}

// TestStorageQuotaAndDiskReserve drives real kvnodes as a tenant filling
// its quota meets them: puts of 4 KiB values to new keys succeed up to
// exactly the quota and then get NO_SPACE with nothing written; another
// tenant is unaffected; a delete makes room; every replica reports the
// same stored bytes; after a whole-cluster restart the figures and the
// quota hold. Then a disk reserve larger than any disk: every growing
// write is NO_SPACE naming the disk, deletes pass, and no node exits.
func TestStorageQuotaAndDiskReserve(t *testing.T) {
	c := &cluster{t: t, dir: t.TempDir()}
	mode := c.pmemDir("synod-e2e-space-")
	for i := 1; i <= 3; i++ {
		c.nodes = append(c.nodes, loopbackNode(t, i))
	}
	write := func(tables string) {
		for _, nd := range c.nodes {
			c.writeConfig(nd, 61, mode, "", tables, []tenant{tenantA, tenantQuota})
		}
	}
	write("")
	t.Cleanup(func() { c.stopAll(true) })
	for _, nd := range c.nodes {
		c.start(nd)
	}
	c.leader()

	q := dialClient(t, c.endpoints(), tenantQuota.token, killClientRetries)
	defer q.Close()
	a := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer a.Close()
	ctx, cancel := ctxTimeout(2 * time.Minute)
	defer cancel()

	const valueBytes = 4096
	key := func(i int) []byte { return fmt.Appendf(nil, "q-%04d", i) }
	cost := sm.KeyCost(len(key(0)), valueBytes)
	const quota = 262144
	wantKeys := int(quota / cost)
	value := make([]byte, valueBytes)
	stored := 0
	var refused error
	for i := 0; i < wantKeys+10; i++ {
		err := q.Put(ctx, key(i), value)
		if err != nil {
			refused = err
			break
		}
		stored++
	}
	if stored != wantKeys || !errors.Is(refused, client.ErrNoSpace) || !strings.Contains(refused.Error(), "quota") {
		t.Fatalf("stored %d keys of cost %d under a quota of %d (want %d), then %v", stored, cost, quota, wantKeys, refused)
	}
	if _, err := q.Get(ctx, key(stored)); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("the refused put was written: %v", err)
	}
	// Another tenant is not capped.
	for i := 0; i < 2*wantKeys; i++ {
		if err := a.Put(ctx, fmt.Appendf(nil, "a-%04d", i), value); err != nil {
			t.Fatalf("tenant without a quota, put %d: %v", i, err)
		}
	}
	// A delete makes room for one more; an overwrite that does not grow
	// passes at the quota.
	if err := q.Delete(ctx, key(0)); err != nil {
		t.Fatalf("delete at the quota: %v", err)
	}
	if err := q.Put(ctx, key(stored), value); err != nil {
		t.Fatalf("put after a delete made room: %v", err)
	}
	if err := q.Put(ctx, key(1), value[:100]); err != nil {
		t.Fatalf("a shrinking overwrite at the quota: %v", err)
	}
	if room := quota - (int64(stored-1)*cost + sm.KeyCost(len(key(1)), 100)); room < cost || room >= 2*cost {
		t.Fatalf("test arithmetic: %d bytes of room, want room for exactly one more key of %d", room, cost)
	}
	want := int64(stored-1)*cost + sm.KeyCost(len(key(1)), 100)

	// Every replica counts the same (the figures are part of the state).
	sameEverywhere := func(when string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			var got []int64
			for _, nd := range c.nodes {
				got = append(got, int64(metricValue(nd, fmt.Sprintf("synod_tenant_stored_bytes{tenant=\"%s\"}", tenantQuota.name))))
			}
			if got[0] == want && got[1] == want && got[2] == want {
				t.Logf("%s: stored bytes on the three nodes %v", when, got)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: stored bytes %v on the three nodes, want %d on each", when, got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	sameEverywhere("before the restart")
	quotaRefusals := 0.0
	for _, nd := range c.nodes {
		quotaRefusals += metricValue(nd, `synod_space_refused_total{reason="quota"}`)
	}
	if quotaRefusals < 1 {
		t.Fatalf("synod_space_refused_total{reason=\"quota\"} = %v across the nodes", quotaRefusals)
	}

	// A whole-cluster restart keeps the figures and the quota.
	q.Close()
	a.Close()
	c.restartAll()
	q = dialClient(t, c.endpoints(), tenantQuota.token, killClientRetries)
	a = dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	sameEverywhere("after the restart")
	// The shrink left room for one more key, not two.
	if err := q.Put(ctx, key(stored+1), value); err != nil {
		t.Fatalf("a put into the room left after the restart: %v", err)
	}
	if err := q.Put(ctx, key(stored+2), value); !errors.Is(err, client.ErrNoSpace) {
		t.Fatalf("a put past the quota after the restart: %v, want NO_SPACE", err)
	}

	// The disk reserve: above the free space (one byte below the
	// filesystem's size, which kvnode accepts), so every growing write is
	// refused, deletes pass, nothing exits.
	q.Close()
	a.Close()
	write(fmt.Sprintf("[limits]\ndisk_free_min_bytes = %d\n", reserveAboveFree(t, c.dir)))
	for _, nd := range c.nodes {
		if err := c.term(nd); err != nil {
			t.Fatal(err)
		}
		c.start(nd)
	}
	c.leader()
	a = dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer a.Close()
	err := a.Put(ctx, []byte("a-new"), []byte("x"))
	if !errors.Is(err, client.ErrNoSpace) || !strings.Contains(err.Error(), "disk") {
		t.Fatalf("a put below the disk reserve: %v", err)
	}
	if err := a.Delete(ctx, []byte("a-0000")); err != nil {
		t.Fatalf("a delete below the disk reserve: %v", err)
	}
	if v, err := a.Get(ctx, []byte("a-0001")); err != nil || len(v) != valueBytes {
		t.Fatalf("a read below the disk reserve: %d bytes, %v", len(v), err)
	}
	for _, nd := range c.nodes {
		if !nd.running() {
			t.Fatalf("node %d exited", nd.id)
		}
	}
	fmt.Printf("e2e space: quota=%d cost=%d stored_keys=%d refused=NO_SPACE other_tenant_keys=%d disk_reserve_refused=NO_SPACE delete_below_reserve=ok\n",
		quota, cost, stored, 2*wantKeys)
}
