package accel

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"synod/paxos"
)

// BenchmarkCommitLatency compares, in one run on the wall clock, the
// leader's commit latency (Arm to commit decision) with the quorum
// aggregator on the receive loop (accel on) and with the acks counted on
// the Paxos goroutine (accel off), while that goroutine is busy with
// application work in commitBenchAppChunk slices — the scheduler wait the
// aggregator removes. Two follower goroutines answer every Accept at once.
// It is a model of the runtime's threads, not the runtime: the figures
// show the effect of where acks are counted, on this machine.
//
//	go test ./accel -run XXX -bench CommitLatency -benchtime 1x
func BenchmarkCommitLatency(b *testing.B) {
	for range b.N {
		var lines []string
		for _, on := range []bool{false, true} {
			p50, p99 := runCommitBench(b, on)
			name := map[bool]string{false: "off", true: "on"}[on]
			b.ReportMetric(float64(p50.Microseconds()), "accel-"+name+"-p50-µs")
			b.ReportMetric(float64(p99.Microseconds()), "accel-"+name+"-p99-µs")
			lines = append(lines, fmt.Sprintf("accel: commit latency accel=%s p50=%v p99=%v", name, p50, p99))
		}
		for _, l := range lines {
			fmt.Println(l)
		}
	}
}

const (
	commitBenchSlots    = 4000
	commitBenchEvery    = 250 * time.Microsecond // proposal rate 4,000 slots/s
	commitBenchAppChunk = 300 * time.Microsecond // application work between inbox reads
)

type benchAck struct {
	slot paxos.Slot
	from paxos.NodeID
}

func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

func runCommitBench(b *testing.B, accelOn bool) (p50, p99 time.Duration) {
	spec := DefaultSpec()
	spec.Replicas, spec.Quorum = 3, 2
	p, err := New(spec)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		p.SetMember(nil, i, paxos.NodeID(i+1))
	}
	p.SetSelf(nil, 0)
	ballot := paxos.Ballot{Round: 1, Node: 1}
	p.SetBallot(nil, ballot)
	p.SetWindowBase(nil, 1)
	p.SetRole(nil, RoleLeader)

	armed := make([]time.Time, commitBenchSlots+1)
	committed := make([]time.Time, commitBenchSlots+1)
	toFollowers := []chan paxos.Slot{make(chan paxos.Slot, 1024), make(chan paxos.Slot, 1024)}
	network := make(chan benchAck, 4096) // into the leader's receive loop
	inbox := make(chan benchAck, 4096)   // into the Paxos goroutine
	var wg sync.WaitGroup

	for i, ch := range toFollowers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range ch {
				network <- benchAck{s, paxos.NodeID(i + 2)}
			}
		}()
	}
	// Receive loop: with accel, the aggregator decides here.
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		var out []Event
		for a := range network {
			if accelOn {
				out = p.OnAccepted(out[:0], a.slot, ballot, a.from)
				for _, e := range out {
					if e.Kind == OutCommit {
						committed[e.Slot] = time.Now()
					}
				}
			}
			inbox <- a // software always gets the ack too
		}
		close(inbox)
	}()
	// Paxos goroutine: counts acks between slices of application work.
	paxosDone := make(chan struct{})
	go func() {
		defer close(paxosDone)
		counts := make([]uint8, commitBenchSlots+1)
		for {
			spin(commitBenchAppChunk)
			for drained := false; !drained; {
				select {
				case a, ok := <-inbox:
					if !ok {
						return
					}
					counts[a.slot]++
					if !accelOn && counts[a.slot] == 1 { // leader + first follower = quorum 2
						committed[a.slot] = time.Now()
					}
				default:
					drained = true
				}
			}
		}
	}()
	next := time.Now()
	for s := paxos.Slot(1); s <= commitBenchSlots; s++ {
		time.Sleep(time.Until(next))
		next = next.Add(commitBenchEvery)
		armed[s] = time.Now()
		p.Arm(nil, s, ballot)
		for _, ch := range toFollowers {
			ch <- s
		}
	}
	for _, ch := range toFollowers {
		close(ch)
	}
	wg.Wait()
	close(network)
	<-recvDone
	<-paxosDone
	lat := make([]time.Duration, 0, commitBenchSlots)
	for s := 1; s <= commitBenchSlots; s++ {
		if !committed[s].IsZero() {
			lat = append(lat, committed[s].Sub(armed[s]))
		}
	}
	if len(lat) < commitBenchSlots {
		b.Fatalf("accel=%v: %d of %d slots committed", accelOn, len(lat), commitBenchSlots)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], lat[len(lat)*99/100]
}
