package main

import (
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"synod/kv/sm"
)

// TestPebbleCollector: the Pebble memory gauges are exported with the
// live Pebble's figures (a fresh store has memtables allocated), and a
// closed store exports nothing rather than failing the scrape.
func TestPebbleCollector(t *testing.T) {
	store, err := sm.Open(filepath.Join(t.TempDir(), "sm"), sm.Options{CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newPebbleCollector(store))
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
	}
	for _, name := range []string{"synod_pebble_block_cache_bytes", "synod_pebble_memtable_bytes",
		"synod_pebble_zombie_memtable_bytes", "synod_pebble_zombie_memtables", "synod_pebble_table_iterators"} {
		if _, ok := got[name]; !ok {
			t.Errorf("%s not exported (got %v)", name, got)
		}
	}
	if got["synod_pebble_memtable_bytes"] <= 0 {
		t.Errorf("memtable bytes %v: want the open memtable counted", got["synod_pebble_memtable_bytes"])
	}
	store.Close()
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 0 {
		t.Fatalf("after Close: %d families, err %v; want none and no error", len(mfs), err)
	}
}
