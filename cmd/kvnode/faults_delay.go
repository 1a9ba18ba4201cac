package main

import (
	"fmt"
	"net/http"
	"time"

	"synod/kv/replica"
)

// The /debug/faults form fields that slow a node once, each a Go duration
// such as "1s": delay_persist delays the next persist of the acceptor log
// (replica.Faults.DelayNextPersist, at most replica.PersistDelayMax);
// delay_apply stalls the apply loop before its next committed entries
// (replica.Faults.DelayNextApply, at most replica.ApplyDelayMax), as a
// state machine stalled on a full disk would.
const (
	persistDelayField = "delay_persist"
	applyDelayField   = "delay_apply"
)

// delayFaults serves POST /debug/faults delay_persist=D and delay_apply=D,
// the fields in the query string or in a form body alike (r.Form; the
// caller parsed it). It reports whether the request carried either field
// (answered here, with 400 for a malformed or out-of-range duration, which
// changes nothing); a request without them is left to the block handler,
// so "block=" alone still heals.
func delayFaults(w http.ResponseWriter, r *http.Request, faults *replica.Faults) bool {
	type delayField struct {
		name    string
		max     time.Duration
		set     func(time.Duration)
		pending func() time.Duration
		what    string
	}
	fields := []delayField{
		{persistDelayField, replica.PersistDelayMax, faults.DelayNextPersist, faults.PersistDelayPending, "next persist"},
		{applyDelayField, replica.ApplyDelayMax, faults.DelayNextApply, faults.ApplyDelayPending, "next apply"},
	}
	var set []func()
	for _, f := range fields {
		if !r.Form.Has(f.name) {
			continue
		}
		v := r.Form.Get(f.name)
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > f.max {
			http.Error(w, fmt.Sprintf("bad %s %q: want a duration in [0, %v]", f.name, v, f.max), http.StatusBadRequest)
			return true
		}
		set = append(set, func() {
			f.set(d)
			fmt.Fprintf(w, "%s delayed by %v\n", f.what, f.pending())
		})
	}
	for _, s := range set {
		s()
	}
	return len(set) > 0
}
