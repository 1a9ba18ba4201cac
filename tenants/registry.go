// Package tenants holds the tenant registry (identity, token, contract) and
// the per-tenant isolation machinery built on it. It never sleeps or reads
// wall time directly: clocks are injected.
package tenants

import (
	"crypto/subtle"
	"errors"
	"fmt"
)

// ID identifies a tenant on the wire (the fixed frame header carries it).
// Zero is never a valid tenant.
type ID uint32

// Class is a tenant's priority class; lower values are served first when
// queues compete.
type Class uint8

const (
	ClassCritical Class = 0
	ClassStandard Class = 1
	ClassBulk     Class = 2
)

// Limits on the registry itself.
const (
	TenantsMax    = 1024 // tenants in one registry
	TokenBytesMax = 256  // longest accepted token
	TokenBytesMin = 8    // shortest accepted token
	NameBytesMax  = 64
	WeightMax     = 1000 // largest DRR weight
)

// Spec is one tenant's identity and contract, as written in kvnode's config.
// A zero rate means "unlimited" for that dimension.
type Spec struct {
	ID            ID
	Name          string
	Token         string
	OpsPerSec     float64
	OpsBurst      float64
	BytesPerSec   float64
	BytesBurst    float64
	Priority      Class
	MaxKeyBytes   int   // 0: the protocol's limit
	MaxValueBytes int   // 0: the protocol's limit
	QuotaBytes    int64 // 0: no storage quota
	// Weight is the tenant's share in the deficit-round-robin scheduler
	// relative to others of its priority class; 0 means 1.
	Weight int
}

// FrameBytesMax is the largest frame the tenant's bytes bucket can ever
// admit: the bucket's capacity as Bucket.SetRate fills it (bytes_burst,
// or one second of bytes_per_sec when the burst is 0, rounded up and
// clamped to BurstTokensMax), or 0 when bytes are unlimited. A larger
// frame is refused TOO_LARGE on its header: the bucket charges a frame at
// most its whole capacity, so such a frame could only pass by draining a
// full bucket, and it would wait behind every smaller frame to get one.
func (s Spec) FrameBytesMax() int64 {
	rate := ratePerSec(s.BytesPerSec)
	if rate == 0 {
		return 0
	}
	burst := ratePerSec(s.BytesBurst)
	if burst == 0 {
		burst = rate
	}
	return int64(min(burst, BurstTokensMax))
}

// Registry maps tokens and ids to tenant specs. It is immutable after
// NewRegistry and safe for concurrent use.
type Registry struct {
	byID  map[ID]*Spec
	specs []Spec
}

// ErrUnknownTenant is returned for an id that is not registered.
var ErrUnknownTenant = errors.New("tenants: unknown tenant")

// NewRegistry validates specs (unique ids, names and tokens; sane limits)
// and builds a registry.
func NewRegistry(specs []Spec) (*Registry, error) {
	if len(specs) > TenantsMax {
		return nil, fmt.Errorf("tenants: %d tenants exceeds TenantsMax=%d", len(specs), TenantsMax)
	}
	r := &Registry{byID: make(map[ID]*Spec, len(specs)), specs: make([]Spec, len(specs))}
	copy(r.specs, specs)
	names := map[string]bool{}
	tokens := map[string]bool{}
	for i := range r.specs {
		s := &r.specs[i]
		switch {
		case s.ID == 0:
			return nil, fmt.Errorf("tenants: tenant %q: id 0 is reserved", s.Name)
		case r.byID[s.ID] != nil:
			return nil, fmt.Errorf("tenants: duplicate tenant id %d", s.ID)
		case s.Name == "" || len(s.Name) > NameBytesMax:
			return nil, fmt.Errorf("tenants: tenant %d: name must be 1..%d bytes", s.ID, NameBytesMax)
		case names[s.Name]:
			return nil, fmt.Errorf("tenants: duplicate tenant name %q", s.Name)
		case len(s.Token) < TokenBytesMin || len(s.Token) > TokenBytesMax:
			return nil, fmt.Errorf("tenants: tenant %q: token must be %d..%d bytes", s.Name, TokenBytesMin, TokenBytesMax)
		case tokens[s.Token]:
			return nil, fmt.Errorf("tenants: tenant %q: token shared with another tenant", s.Name)
		case s.OpsPerSec < 0 || s.OpsBurst < 0 || s.BytesPerSec < 0 || s.BytesBurst < 0:
			return nil, fmt.Errorf("tenants: tenant %q: negative rate or burst", s.Name)
		case s.MaxKeyBytes < 0 || s.MaxValueBytes < 0 || s.QuotaBytes < 0 || s.Weight < 0 || s.Weight > WeightMax:
			return nil, fmt.Errorf("tenants: tenant %q: negative limit or weight above %d", s.Name, WeightMax)
		case s.Priority > ClassBulk:
			return nil, fmt.Errorf("tenants: tenant %q: unknown priority class %d", s.Name, s.Priority)
		}
		names[s.Name] = true
		tokens[s.Token] = true
		r.byID[s.ID] = s
	}
	return r, nil
}

// Authenticate returns the tenant whose token matches. Every registered
// token is compared in constant time, so timing does not reveal which
// prefix matched.
func (r *Registry) Authenticate(token string) (Spec, bool) {
	var found *Spec
	for i := range r.specs {
		s := &r.specs[i]
		if subtle.ConstantTimeCompare([]byte(s.Token), []byte(token)) == 1 {
			found = s
		}
	}
	if found == nil {
		return Spec{}, false
	}
	return *found, true
}

// Get returns the spec for id.
func (r *Registry) Get(id ID) (Spec, bool) {
	s := r.byID[id]
	if s == nil {
		return Spec{}, false
	}
	return *s, true
}

// All returns a copy of every spec, in registration order.
func (r *Registry) All() []Spec {
	out := make([]Spec, len(r.specs))
	copy(out, r.specs)
	return out
}
