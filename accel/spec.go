package accel

import (
	"errors"
	"fmt"
	"time"
)

// TickDuration is the length of one plane tick. Every time the plane sees
// (Input.Now, the Spec's periods, retry-after figures) counts these ticks.
// One tick is one microsecond, which makes the token-bucket arithmetic exact
// in integers: a rate of R tokens per second refills R micro-tokens per tick.
const TickDuration = time.Microsecond

// Limits on a Spec. They bound the fixed-size state the plane allocates once
// (and that the RTL instantiates as memories and registers).
const (
	WindowSlotsMin = 2
	WindowSlotsMax = 1 << 16 // slot-table entries
	ReplicasMax    = 16      // member-table entries (ack bitmasks are 16 bits wide)
	TenantsMax     = 1024    // token-bucket table entries
	PeriodTicksMax = 1 << 30 // longest heartbeat, lease or election period
)

// ErrBadSpec wraps every Spec validation failure.
var ErrBadSpec = errors.New("accel: bad spec")

// Spec is the plane's static configuration: plain, copyable, validated by
// New before anything is allocated. It is written into every trace header
// so a replay (Go or RTL) builds the same plane.
type Spec struct {
	// WindowSlots is the size of the quorum aggregator's slot table and of
	// the accept fast path's slot window. A power of two.
	WindowSlots int
	// Replicas is the size of the member table (the most acceptors the
	// plane can track), 1..ReplicasMax.
	Replicas int
	// Quorum is the initial quorum register, 1..Replicas. Software may
	// rewrite it (SetQuorum) on a membership change.
	Quorum int
	// HeartbeatPeriodTicks is the leader's heartbeat period.
	HeartbeatPeriodTicks uint32
	// LeaseTicks is how long an acknowledged heartbeat keeps the leader's
	// lease alive, measured from the heartbeat's send time.
	LeaseTicks uint32
	// LeaseDriftTicks is the clock-drift bound subtracted from LeaseTicks on
	// the leader side. Must be < LeaseTicks.
	LeaseDriftTicks uint32
	// ElectionTicks is a follower's base election timeout.
	ElectionTicks uint32
	// ElectionJitterTicks is the width of the random extra timeout added to
	// ElectionTicks on each reset: a power of two, or 0 for none.
	ElectionJitterTicks uint32
	// TenantsMax is the size of the token-bucket table, 0..TenantsMax.
	TenantsMax int
	// Seed seeds the election-jitter generator (a 32-bit xorshift). Zero is
	// replaced by a fixed non-zero constant, since xorshift sticks at zero.
	Seed uint32
}

// DefaultSpec returns the configuration the RTL is sized for by default:
// a 4,096-slot window, 5 replicas (quorum 3) and 32 tenants.
func DefaultSpec() Spec {
	return Spec{
		WindowSlots:          4096,
		Replicas:             5,
		Quorum:               3,
		HeartbeatPeriodTicks: 10_000,  // 10 ms
		LeaseTicks:           100_000, // 100 ms
		LeaseDriftTicks:      10_000,  // 10 ms
		ElectionTicks:        150_000, // 150 ms
		ElectionJitterTicks:  65_536,  // up to ~65 ms extra
		TenantsMax:           32,
		Seed:                 1,
	}
}

func isPow2(n uint64) bool { return n != 0 && n&(n-1) == 0 }

// Validate reports the first problem with s, wrapped in ErrBadSpec.
func (s Spec) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadSpec, fmt.Sprintf(format, args...))
	}
	switch {
	case s.WindowSlots < WindowSlotsMin || s.WindowSlots > WindowSlotsMax || !isPow2(uint64(s.WindowSlots)):
		return bad("WindowSlots=%d must be a power of two in [%d, %d]", s.WindowSlots, WindowSlotsMin, WindowSlotsMax)
	case s.Replicas < 1 || s.Replicas > ReplicasMax:
		return bad("Replicas=%d must be in [1, %d]", s.Replicas, ReplicasMax)
	case s.Quorum < 1 || s.Quorum > s.Replicas:
		return bad("Quorum=%d must be in [1, Replicas=%d]", s.Quorum, s.Replicas)
	case s.HeartbeatPeriodTicks == 0 || s.HeartbeatPeriodTicks > PeriodTicksMax:
		return bad("HeartbeatPeriodTicks=%d must be in [1, %d]", s.HeartbeatPeriodTicks, PeriodTicksMax)
	case s.LeaseTicks == 0 || s.LeaseTicks > PeriodTicksMax:
		return bad("LeaseTicks=%d must be in [1, %d]", s.LeaseTicks, PeriodTicksMax)
	case s.LeaseDriftTicks >= s.LeaseTicks:
		return bad("LeaseDriftTicks=%d must be below LeaseTicks=%d", s.LeaseDriftTicks, s.LeaseTicks)
	case s.ElectionTicks == 0 || s.ElectionTicks > PeriodTicksMax:
		return bad("ElectionTicks=%d must be in [1, %d]", s.ElectionTicks, PeriodTicksMax)
	case s.ElectionJitterTicks != 0 && (!isPow2(uint64(s.ElectionJitterTicks)) || s.ElectionJitterTicks > PeriodTicksMax):
		return bad("ElectionJitterTicks=%d must be 0 or a power of two <= %d", s.ElectionJitterTicks, PeriodTicksMax)
	case s.HeartbeatPeriodTicks >= s.ElectionTicks:
		return bad("HeartbeatPeriodTicks=%d must be below ElectionTicks=%d", s.HeartbeatPeriodTicks, s.ElectionTicks)
	case s.TenantsMax < 0 || s.TenantsMax > TenantsMax:
		return bad("TenantsMax=%d must be in [0, %d]", s.TenantsMax, TenantsMax)
	}
	return nil
}
