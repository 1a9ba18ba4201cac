package space

import (
	"time"

	"github.com/rs/zerolog"
)

// Reclaiming space. Pebble gives back the disk space of deleted and
// overwritten values only when a compaction rewrites the tables holding
// them; on its own it may not do so for minutes, and a node at its
// reserve stayed there after its tenants deleted everything (an outside
// tester: 60 s with every key deleted, until a restart). So while the
// reserve is on, a loop reads the free space every reclaimInterval, and
// when it is below reclaimAtReserveTimes x the reserve and writes have
// deleted or replaced values since the last compaction (sm.Garbage), it
// compacts the whole store once (at most one compaction at a time; the
// next only after more garbage). This runs on every node, followers
// included: each gives back its own disk.
//
// A compaction writes its new tables before it deletes the old ones, and
// a Pebble whose MANIFEST write fails for space stops the process (seen:
// a compaction started at 17 MB free with 176 MB stored). So it runs only
// when the free space, less reclaimMarginBytes, holds everything stored
// (sm.StoredBytes, an upper bound of what it writes); otherwise the loop
// says why, at most once per reclaimSkipLogEvery.
const (
	reclaimInterval = time.Second
	// reclaimAtReserveTimes: compaction starts before the reserve is
	// reached, when free space is below this multiple of it.
	reclaimAtReserveTimes = 2
	// reclaimMarginBytes is free space a compaction leaves untouched.
	reclaimMarginBytes = 16 << 20
	// reclaimSkipLogEvery bounds the "cannot compact" log lines.
	reclaimSkipLogEvery = time.Minute
)

// Start starts the reclaim loop (nothing when the reserve is off); Stop
// ends it and waits for a compaction in progress.
func (g *Guard) Start(log zerolog.Logger) {
	if g.cfg.DiskFreeMinBytes <= 0 {
		return
	}
	g.stopC, g.doneC = make(chan struct{}), make(chan struct{})
	go g.reclaimLoop(log)
}

// Stop ends the reclaim loop.
func (g *Guard) Stop() {
	if g.stopC == nil {
		return
	}
	close(g.stopC)
	<-g.doneC
}

func (g *Guard) reclaimLoop(log zerolog.Logger) {
	defer close(g.doneC)
	t := time.NewTicker(reclaimInterval)
	defer t.Stop()
	for {
		select {
		case <-g.stopC:
			return
		case <-t.C:
		}
		g.reclaimOnce(log)
	}
}

// reclaimOnce compacts when the disk is short and there is garbage; it
// reports whether it did.
func (g *Guard) reclaimOnce(log zerolog.Logger) bool {
	g.sample(g.cfg.Now().UnixNano())
	if b, _ := g.freeErr.Load().(errBox); b.err != nil {
		return false
	}
	free := g.free.Load()
	garbage := g.cfg.Ledger.Garbage()
	if free >= reclaimAtReserveTimes*g.cfg.DiskFreeMinBytes || garbage == 0 {
		return false
	}
	if stored := int64(g.cfg.Ledger.StoredBytes()); free-reclaimMarginBytes < stored {
		if ok, _ := g.skipLog.Allow(time.Now()); ok {
			log.Warn().Int64("free", free).Int64("stored", stored).Uint64("garbage_values", garbage).
				Msg("disk short of space, but too short to compact the store safely (a compaction writes up to what is stored before it frees); delete more or add disk")
		}
		return false
	}
	start := time.Now()
	err := g.cfg.Ledger.Compact()
	g.compactions.Add(1)
	g.sample(g.cfg.Now().UnixNano()) // read again now
	ev := log.Info()
	if err != nil {
		ev = log.Error().Err(err)
	}
	// Pebble deletes the replaced tables only after the compaction
	// returns, so the reading now may be lower than before it (an outside
	// tester took free_after for the result); the space shows in
	// synod_disk_free_bytes a moment later.
	ev.Int64("free_before", free).Int64("free_at_return", g.free.Load()).Uint64("garbage_values", garbage).
		Dur("took", time.Since(start)).Int64("reserve", g.cfg.DiskFreeMinBytes).
		Msg("disk short of space: compacted the store to give back deleted and overwritten values (the replaced tables are deleted just after: see synod_disk_free_bytes)")
	return true
}
