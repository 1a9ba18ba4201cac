package rtl

import (
	"path/filepath"
	"testing"
)

// replicaRuntimeTests are kv/replica's in-process accel cluster tests:
// three real Replicas (consensus, receive, apply and heartbeat loops,
// PMem acceptor logs, the follower fast path) over an in-memory network,
// each accel-soft node driving one accel.Plane from the runtime's own
// goroutines with wall-clock ticks. With $ACCEL_TRACE_DIR set they record
// every plane's trace there (kv/replica/accel_trace_test.go). Between them:
// all-soft and mixed clusters under concurrent writes with a leader
// change, a restart of every node, a leader stall, a partition and heal.
const replicaRuntimeTests = "^TestAccel(SoftCluster|MixedCluster|RestartRecovers|HeartbeatsDuringStall|PartitionHeal|MirrorAgrees)$"

// replicaTraces records the runtime traces by running those tests runs
// times in a child `go test` (~15,000 inputs a run: each run's timing, hence
// its trace, differs) and returns their paths. The runtime's spec (1024-slot
// window, 3 replicas, 32 tenants) needs its own RTL build.
func replicaTraces(t *testing.T, runs int) []string {
	t.Helper()
	deps := []string{"accel_trace_test.go", "accel_cluster_test.go", "accel_test.go", "cluster_test.go", "accel.go"}
	for i, d := range deps {
		deps[i] = filepath.Join("..", "kv", "replica", d)
	}
	return childTraces(t, "synod/kv/replica", replicaRuntimeTests, runs, deps...)
}
