package replica

import (
	"sync/atomic"
	"time"

	"synod/tenants"
)

// The pipeline gate: where writes wait when the pipeline is full.
//
// The tenant scheduler (tenants.DRR) is fair only if writes wait in it.
// Without a gate the consensus loop drains it on every input into paxos,
// whose queue and pipeline are FIFO: under a flood the backlog builds in
// the pipeline (slots in flight, the followers' persists, the apply
// queue), and a victim tenant's write waits behind every flood write
// proposed before it, whatever the scheduler decided. So the loop takes
// writes from the scheduler only while fewer than pipelineCmdsMax
// proposed writes wait for their answer; the rest of the backlog stays in
// the scheduler, where a tenant with a small share of the load is served
// in its next round, and goes out in batches as the pipeline drains.
//
// The bound is in commands, not slots: on a machine whose CPU the
// pipeline saturates, every command costs CPU on three replicas, a
// round's length grows with the commands it carries, and a write entering
// the pipeline waits for the commands ahead of it however they are cut
// into slots. Measured side by side at one offered flood
// (docs/benchmarking.md "The pipeline gate"): without the gate a victim's
// P99 under a 1.5x flood was 30-55x quiet; with 64 commands 5-8x, with
// throughput under the flood no lower; with 32 commands 3-7x, at some
// throughput; bounding slots (full batches) instead gave the most
// throughput and a victim still 10-18x. 64 is the balance kept.
//
// It applies only with a scheduler (tenants configured), and only while
// more than one tenant writes (tenantMix): with one tenant there is
// nobody to be unfair to, and its writes are better queued where they
// batch; the gate cost a single tenant with 8,192 writes in flight a
// third of its throughput and hundreds of THROTTLED retries running out
// (e2e TestClientChurn). Without a scheduler proposeC is the only queue
// and the order is FIFO either way.
const pipelineCmdsMax = 64

// pipelineBytesMax bounds the same writes by their bytes: 64 commands of
// 1 MiB are 64 MiB for a victim's write to wait behind (each replicated,
// persisted and applied on three replicas first). An outside tester's
// tenant pipelining 1 MB PUTs left another tenant's small writes at a
// median of 1.1 s and a P99 of 2.3 s. The gate takes at least one write
// whatever its size, so a write larger than the bound still goes, alone.
//
// 2 MiB, not 4: the same tester's script (3 connections pipelining 1 MB
// PUTs beside a tenant writing 100-byte values one at a time, shm logs),
// the two builds alternated over 5 rounds, put the small writes' median at
// 67-101 ms with 2 MiB against 114-169 ms with 4 MiB, and the 1 MB writes'
// throughput no lower (40-63 MB/s against 33-50): on two cores the stages
// a big write passes through gain little from overlapping, and the victim
// waits behind every byte ahead of it (docs/benchmarking.md "Bytes as well
// as commands"). 1 MiB cost the big writer a third of its throughput.
const pipelineBytesMax = 2 << 20

// tenantMixWindow is how long after two tenants' writes interleaved the
// gate stays engaged.
const tenantMixWindow = time.Second

// tenantMix tells whether more than one tenant wrote recently: it keeps
// the last writer and when a write came from another tenant than the one
// before it. Safe for concurrent use; two atomic operations per write.
type tenantMix struct {
	last    atomic.Uint64 // tenants.ID+1 of the last write; 0: none yet
	mixedAt atomic.Int64  // unix nanoseconds of the last change of writer
}

// note records a write of tenant at now.
func (m *tenantMix) note(tenant tenants.ID, now time.Time) {
	id := uint64(tenant) + 1
	if prev := m.last.Swap(id); prev != 0 && prev != id {
		m.mixedAt.Store(now.UnixNano())
	}
}

// contended reports whether two tenants' writes interleaved within
// tenantMixWindow of now.
func (m *tenantMix) contended(now time.Time) bool {
	at := m.mixedAt.Load()
	return at != 0 && now.UnixNano()-at < int64(tenantMixWindow)
}

// gateEngaged reports whether the gate bounds the pipeline now.
func (r *Replica) gateEngaged() bool {
	return !testingNoPipelineGate.Load() && r.mix.contended(r.cfg.Now())
}

// pipelineCmds is how many proposed writes wait for their answer: every
// waiting writer (inflightWrites) but those still in the scheduler.
// Writes between submitWrite's bookkeeping and the scheduler's enqueue
// count as proposed for that moment, which only closes the gate early.
func (r *Replica) pipelineCmds() int {
	n := int(r.inflightWrites.Load())
	if r.drr != nil {
		n -= r.drr.Len()
	}
	return max(n, 0)
}

// pipelineBytes is the bytes of the writes pipelineCmds counts (their
// envelopes).
func (r *Replica) pipelineBytes() int {
	n := r.pendingBytes.Load()
	if r.drr != nil {
		n -= r.queuedBytes.Load()
	}
	return int(max(n, 0))
}

// pipelineFull reports whether the gate's bound on commands or on bytes
// is reached.
func (r *Replica) pipelineFull() bool {
	return r.pipelineCmds() >= pipelineCmdsMax || (!testingNoPipelineBytes.Load() && r.pipelineBytes() >= pipelineBytesMax)
}

// drrGate returns the scheduler's kick channel when the loop may take
// writes from it, nil while the pipeline is full (consensus loop). A
// closed gate is reopened by the answer that frees room (gateWake).
func (r *Replica) drrGate() chan struct{} {
	if r.drrKick == nil {
		return nil
	}
	if !r.gateEngaged() {
		r.gated.Store(false)
		return r.drrKick
	}
	if r.pipelineFull() {
		r.gated.Store(true)
		// An answer may have come between the count and the store:
		// look again, so a wake is never lost.
		if r.pipelineFull() {
			return nil
		}
	}
	r.gated.Store(false)
	return r.drrKick
}

// gateWake wakes the consensus loop when writes were answered (or
// failed) while its gate was closed (any goroutine).
func (r *Replica) gateWake() {
	if !r.gated.Load() {
		return
	}
	select {
	case r.gateC <- struct{}{}:
	default:
	}
}

// drrBatchMax is how many writes, and how many of their bytes, one
// scheduler batch may take now: the batch stops once it reaches either
// (its last write may pass the byte bound: the scheduler cannot be asked
// a write's size before it is taken; its first write always goes);
// engaged says whether the gate bounded them (gateEngaged).
func (r *Replica) drrBatchMax() (cmds, bytes int, engaged bool) {
	if !r.gateEngaged() {
		return proposeBatchCmdsMax, proposeBatchBytesMax, false
	}
	cmds = max(1, min(proposeBatchCmdsMax, pipelineCmdsMax-r.pipelineCmds()))
	bytes = proposeBatchBytesMax
	if !testingNoPipelineBytes.Load() {
		bytes = max(1, min(bytes, pipelineBytesMax-r.pipelineBytes()))
	}
	return cmds, bytes, true
}

// pipelineSlots is the pipeline window a new replica gives its paxos node:
// pipelineSlotsMax (limits.go), or paxos's default where a test plants the
// wide window.
func pipelineSlots() int {
	if testingWidePipeline {
		return 0
	}
	return pipelineSlotsMax
}
