package replica

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"synod/internal/stall"
	"synod/kv/proto"
	"synod/kv/server"
	"synod/paxos"
)

// histCount is how many observations a stage histogram's child holds.
func histCount(t *testing.T, o prometheus.Observer) uint64 {
	t.Helper()
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// doReceived runs req on node id as the client server would hand it over:
// with the time its header was read in the context (admission).
func (c *testCluster) doReceived(id paxos.NodeID, req *proto.Request) *proto.Response {
	ctx, cancel := context.WithTimeout(server.WithReceived(context.Background(), time.Now()), 5*time.Second)
	defer cancel()
	return c.nodes[id].be.Do(ctx, testTenant, req)
}

// TestStagesTimedOnEveryPath: every stage of the write and read paths is
// timed on the leader, the followers time their own half (persist,
// commit, apply queue, apply) and nothing of the leader's, and the
// per-write and per-slot stages count each write and slot once.
func TestStagesTimedOnEveryPath(t *testing.T) {
	c := newTestClusterWith(t, func(c *testCluster) { c.drr = true })
	l := c.leader()
	const writes = 40
	for i := 0; i < writes; i++ {
		k := fmt.Sprintf("k%d", i)
		if resp := c.doReceived(l, putReq(k, "v")); resp.Status != proto.StatusOK {
			t.Fatalf("put: %v", resp.Status)
		}
		if resp := c.doReceived(l, getReq(k, false)); resp.Status != proto.StatusOK {
			t.Fatalf("get: %v", resp.Status)
		}
	}
	for id, n := range c.nodes {
		c.waitApplied(id, c.nodes[l].r.Applied())
		m := n.r.metrics
		for i, name := range WriteStages {
			got := histCount(t, m.stages.write[i])
			leaderOnly := name != stagePersist && name != stageCommit && name != stageApplyQueue && name != stageApply
			switch {
			case id == l && got == 0:
				t.Errorf("leader: write stage %s never timed", name)
			case id != l && leaderOnly && got != 0:
				t.Errorf("follower %d: leader stage %s timed %d times", id, name, got)
			case id != l && !leaderOnly && got == 0:
				t.Errorf("follower %d: write stage %s never timed", id, name)
			}
		}
		for i, name := range ReadStages {
			got := histCount(t, m.stages.read[i])
			if id == l && got != writes {
				t.Errorf("leader: read stage %s timed %d times for %d reads", name, got, writes)
			}
			if id != l && got != 0 {
				t.Errorf("follower %d: read stage %s timed %d times", id, name, got)
			}
		}
	}
	m := c.nodes[l].r.metrics
	for _, st := range []writeStage{wsAdmission, wsProposeQueue, wsReply} {
		if got := histCount(t, m.stages.write[st]); got != writes {
			t.Errorf("per-write stage %s timed %d times for %d writes", WriteStages[st], got, writes)
		}
	}
	// Each slot the leader proposed is timed once from proposal to Ready
	// and once for its round trip (no leader change here).
	ready, rtt := histCount(t, m.stages.write[wsReady]), histCount(t, m.stages.write[wsAcceptRTT])
	if ready == 0 || ready != rtt || ready > writes {
		t.Errorf("ready timed %d slots, accept_rtt %d; want the same count, 1..%d", ready, rtt, writes)
	}
	if st := counterValue(m.Stalls.WithLabelValues(pathWrite, stagePersist)); st != 0 {
		t.Errorf("%v persist stalls counted without a detector", st)
	}
}

// slowLog delays the next Persist calls of an acceptor log.
type slowLog struct {
	AcceptorLog
	delay atomic.Int64 // ns
	slow  atomic.Int32 // Persist calls left to delay
}

func (s *slowLog) Persist() error {
	if s.slow.Add(-1) >= 0 {
		time.Sleep(time.Duration(s.delay.Load()))
	}
	return s.AcceptorLog.Persist()
}

// lockedBuffer is a log sink written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStallDetectedAtSlowPersist plants a leader persist that takes 60 ms
// once: the stall detector must count a persist stall, log it with the
// write's slot and keep a trace of it.
func TestStallDetectedAtSlowPersist(t *testing.T) {
	var lb lockedBuffer
	dir := t.TempDir()
	det, err := stall.New(stall.Config{Recorder: true, Dir: dir}, zerolog.New(&lb))
	if err != nil {
		t.Fatal(err)
	}
	defer det.Close()
	logs := map[paxos.NodeID]*slowLog{}
	var mu sync.Mutex
	c := newTestClusterWith(t, func(c *testCluster) {
		c.stalls = det
		c.wrapLog = func(id paxos.NodeID, l AcceptorLog) AcceptorLog {
			s := &slowLog{AcceptorLog: l}
			mu.Lock()
			logs[id] = s
			mu.Unlock()
			return s
		}
	})
	l := c.leader()
	c.put("warm", "v")
	r := c.nodes[l].r
	before := counterValue(r.metrics.Stalls.WithLabelValues(pathWrite, stagePersist))
	mu.Lock()
	sl := logs[l]
	mu.Unlock()
	sl.delay.Store(int64(60 * time.Millisecond))
	sl.slow.Store(1)
	if resp := c.do(l, putReq("slow", "v"), 5*time.Second); resp.Status != proto.StatusOK {
		t.Fatalf("put: %v", resp.Status)
	}
	slot := r.Applied()
	if got := counterValue(r.metrics.Stalls.WithLabelValues(pathWrite, stagePersist)) - before; got < 1 {
		t.Fatalf("%v persist stalls counted after a 60 ms persist (threshold %v)", got, det.Threshold())
	}
	deadline := time.Now().Add(20 * time.Second)
	for det.Stats().Written == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	var found map[string]any
	sc := bufio.NewScanner(strings.NewReader(lb.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["stage"] == stagePersist && m["trace"] != "" && m["trace"] != nil {
			found = m
		}
	}
	if found == nil {
		t.Fatalf("no persist stall line with a trace:\n%s", lb.String())
	}
	if found["slot"] != float64(slot) || found["took_ms"].(float64) < 60 {
		t.Errorf("stall line %v: want slot %d and took_ms >= 60", found, slot)
	}
	b, err := os.ReadFile(found["trace"].(string))
	if err != nil || !bytes.Contains(b, []byte("stage=persist")) {
		t.Fatalf("trace %v: %v (%d bytes); want the persist stall's mark", found["trace"], err, len(b))
	}
}
