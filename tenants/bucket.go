package tenants

import "math"

// Token-bucket arithmetic in integers, so the RTL shaper can mirror it
// bit for bit. Time is counted in microseconds and tokens in micro-tokens
// (one millionth of a token), which makes the refill exact: a rate of R
// tokens per second adds R micro-tokens per microsecond.
const (
	MicroTokensPerToken = 1_000_000
	// RatePerSecMax bounds a bucket's rate (tokens per second), so that
	// refillElapsedMicrosMax * RatePerSecMax fits in 63 bits.
	RatePerSecMax = 1 << 32
	// BurstTokensMax bounds a bucket's burst; BurstTokensMax * 1e6 < 2^60.
	BurstTokensMax = 1 << 40
	// refillElapsedMicrosMax caps the elapsed time one refill accounts for
	// (about 17.9 minutes); any bucket is full long before that at any
	// rate >= 1/s with a burst below BurstTokensMax... except huge bursts at
	// tiny rates, which a longer idle period then refills in several steps.
	refillElapsedMicrosMax = 1 << 30
	// costUnitsMax clamps the units one admission is charged for; any
	// larger frame costs the whole burst anyway (BurstTokensMax < it).
	costUnitsMax = 1 << 42
)

// Bucket is one token bucket. The zero Bucket (Rate 0) is unlimited: it
// admits everything and holds no tokens. Fields are exported so the accel
// plane and its trace can hold the same state; use SetRate to configure.
//
// Invariant: Rate == 0 || Tokens <= Burst.
type Bucket struct {
	Rate   uint64 // tokens per second (= micro-tokens per microsecond); 0 = unlimited
	Burst  uint64 // capacity in micro-tokens
	Tokens uint64 // current content in micro-tokens
	Last   uint64 // time of the last refill, microseconds
}

// SetRate configures the bucket (rate in tokens/s, burst in tokens) and
// fills it, as of now. Values above the maxima are clamped; a zero burst
// with a non-zero rate means one second's worth.
func (b *Bucket) SetRate(ratePerSec, burstTokens, nowMicros uint64) {
	ratePerSec = min(ratePerSec, RatePerSecMax)
	if ratePerSec != 0 && burstTokens == 0 {
		burstTokens = ratePerSec
	}
	burstTokens = min(burstTokens, BurstTokensMax)
	b.Rate = ratePerSec
	b.Burst = burstTokens * MicroTokensPerToken
	b.Tokens = b.Burst
	b.Last = nowMicros
	if ratePerSec == 0 {
		*b = Bucket{Last: nowMicros}
	}
}

// Refill adds what the time since Last earned. Time never runs backwards
// here: an earlier now leaves the bucket alone.
func (b *Bucket) Refill(nowMicros uint64) {
	if nowMicros <= b.Last {
		return
	}
	elapsed := min(nowMicros-b.Last, refillElapsedMicrosMax)
	b.Last = nowMicros
	if b.Rate == 0 {
		return
	}
	b.Tokens = min(b.Tokens+elapsed*b.Rate, b.Burst)
}

// Cost returns the micro-token cost of n units, capped at the burst so that
// an item larger than the burst can still pass once the bucket is full
// (rather than never).
func (b *Bucket) Cost(units uint64) uint64 {
	// Multiply rather than divide (the RTL mirrors this): units is first
	// clamped to costUnitsMax, so the product cannot overflow.
	c := min(units, costUnitsMax) * MicroTokensPerToken
	return min(c, b.Burst)
}

// Wait returns how many microseconds until the bucket holds cost
// micro-tokens (0 when it already does): ceil((cost - tokens) / rate).
func (b *Bucket) Wait(cost uint64) uint64 {
	if b.Rate == 0 || b.Tokens >= cost {
		return 0
	}
	return (cost - b.Tokens + b.Rate - 1) / b.Rate
}

// AdmitPair is the shaper's admission rule on an ops bucket and a bytes
// bucket, as of now: both are refilled; if both hold the frame's cost
// (1 op, frameBytes bytes) both are charged and ok is true; otherwise
// nothing is charged and waitMicros is the longer of the two waits.
// The RTL shaper implements exactly this.
func AdmitPair(ops, bytes *Bucket, frameBytes, nowMicros uint64) (ok bool, waitMicros uint64) {
	ops.Refill(nowMicros)
	bytes.Refill(nowMicros)
	opsCost, bytesCost := ops.Cost(1), bytes.Cost(frameBytes)
	w := max(ops.Wait(opsCost), bytes.Wait(bytesCost))
	if w > 0 {
		return false, w
	}
	if ops.Rate != 0 {
		ops.Tokens -= opsCost
	}
	if bytes.Rate != 0 {
		bytes.Tokens -= bytesCost
	}
	return true, 0
}

// ratePerSec converts a configured float rate to the integer rate buckets
// use, rounding up so a contract is never shaved.
func ratePerSec(r float64) uint64 {
	if r <= 0 || math.IsNaN(r) {
		return 0
	}
	if r >= RatePerSecMax {
		return RatePerSecMax
	}
	return uint64(math.Ceil(r))
}
