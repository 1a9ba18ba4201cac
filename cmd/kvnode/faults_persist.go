package main

import (
	"fmt"
	"net/http"
	"time"

	"synod/kv/replica"
)

// persistDelayField is the /debug/faults form field that delays the next
// persist of the acceptor log once (replica.Faults.DelayNextPersist): a Go
// duration such as "1s", at most replica.PersistDelayMax.
const persistDelayField = "delay_persist"

// persistDelayFault serves POST /debug/faults delay_persist=D, the field
// in the query string or in a form body alike (r.Form; the caller parsed
// it). It reports whether the request carried the field (answered here,
// with 400 for a malformed or out-of-range duration); a request without it
// is left to the block handler, so "block=" alone still heals.
func persistDelayFault(w http.ResponseWriter, r *http.Request, faults *replica.Faults) bool {
	if !r.Form.Has(persistDelayField) {
		return false
	}
	v := r.Form.Get(persistDelayField)
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > replica.PersistDelayMax {
		http.Error(w, fmt.Sprintf("bad %s %q: want a duration in [0, %v]", persistDelayField, v, replica.PersistDelayMax), http.StatusBadRequest)
		return true
	}
	faults.DelayNextPersist(d)
	fmt.Fprintf(w, "next persist delayed by %v\n", faults.PersistDelayPending())
	return true
}
