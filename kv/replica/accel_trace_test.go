package replica

import (
	"fmt"
	"os"
	"strings"

	"synod/paxos"
)

// accelTraceDirEnv names the directory where the in-process accel cluster
// tests record each plane's input/output trace (the RTL co-simulation's
// "replica" source runs them with it set). Unset, nothing is recorded.
const accelTraceDirEnv = "ACCEL_TRACE_DIR"

// accelConfig is the accel configuration node id of c starts with: with
// $ACCEL_TRACE_DIR set, the plane's trace goes to a new file there, named
// for the test and the node (one file per start, so a restart does not
// overwrite the first run's trace). The file closes at cleanup after the
// node has stopped, since Replica.Close flushes the plane's trace last.
func (c *testCluster) accelConfig(id paxos.NodeID) *AccelConfig {
	dir := os.Getenv(accelTraceDirEnv)
	if dir == "" {
		return &AccelConfig{}
	}
	name := strings.NewReplacer("/", "_", "=", "-", string(os.PathSeparator), "_").Replace(c.t.Name())
	f, err := os.CreateTemp(dir, fmt.Sprintf("replica-%s-node%d-*.trace", name, id))
	if err != nil {
		c.t.Fatalf("%s: %v", accelTraceDirEnv, err)
	}
	// Cleanups run last-in first-out: this one runs before the cluster's,
	// so it stops the node itself (stop is idempotent) before closing.
	c.t.Cleanup(func() {
		c.stop(id)
		if err := f.Close(); err != nil {
			c.t.Errorf("closing the accel trace %s: %v", f.Name(), err)
		}
	})
	return &AccelConfig{Trace: f}
}
