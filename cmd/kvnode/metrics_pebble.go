package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"synod/kv/sm"
)

// pebbleCollector exports the state machine's Pebble memory
// (sm.PebbleUse) at each scrape: the manual memory outside the Go heap
// that the node's memory budget gives Pebble (kv/README.md "Memory").
type pebbleCollector struct {
	store                                         *sm.SM
	cache, memtables, zombieBytes, zombies, iters *prometheus.Desc
}

func newPebbleCollector(store *sm.SM) *pebbleCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("synod_pebble_"+name, help, nil, nil)
	}
	return &pebbleCollector{
		store:       store,
		cache:       d("block_cache_bytes", "Bytes of blocks in Pebble's block cache."),
		memtables:   d("memtable_bytes", "Bytes of Pebble memtables and flushable batches allocated."),
		zombieBytes: d("zombie_memtable_bytes", "Bytes of flushed memtables an open iterator still holds."),
		zombies:     d("zombie_memtables", "Flushed memtables an open iterator still holds."),
		iters:       d("table_iterators", "Open sstable iterators."),
	}
}

func (c *pebbleCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.cache
	ch <- c.memtables
	ch <- c.zombieBytes
	ch <- c.zombies
	ch <- c.iters
}

func (c *pebbleCollector) Collect(ch chan<- prometheus.Metric) {
	u, ok := c.store.PebbleUse()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.cache, prometheus.GaugeValue, float64(u.CacheBytes))
	ch <- prometheus.MustNewConstMetric(c.memtables, prometheus.GaugeValue, float64(u.MemTableBytes))
	ch <- prometheus.MustNewConstMetric(c.zombieBytes, prometheus.GaugeValue, float64(u.ZombieMemTableBytes))
	ch <- prometheus.MustNewConstMetric(c.zombies, prometheus.GaugeValue, float64(u.ZombieMemTables))
	ch <- prometheus.MustNewConstMetric(c.iters, prometheus.GaugeValue, float64(u.TableIters))
}
