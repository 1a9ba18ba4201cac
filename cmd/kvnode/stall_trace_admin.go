package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/rs/zerolog"

	"synod/internal/stall"
)

// stallTracePath turns the stall detector's flight recorder on and off
// while the node runs: the recorder is off by default ([stall] trace,
// config_stall.go) because it costs every node CPU and tail, so an
// operator who sees stalls in synod_stage_stalls_total turns it on here,
// without a restart, and off again once the traces are taken.
//
//	GET  /debug/stall_trace          -> {"trace":false}
//	POST /debug/stall_trace?on=true  -> {"trace":true,"changed":true}
//
// The admin token guards it like every admin path (adminHandler). With
// the detector off ([stall] threshold = "off") it answers 409.
const stallTracePath = "/debug/stall_trace"

// stallTraceState is the answer of stallTracePath.
type stallTraceState struct {
	Trace   bool `json:"trace"`
	Changed bool `json:"changed,omitempty"`
}

// stallTraceHandler serves stallTracePath for d (nil: the detector is
// off).
func stallTraceHandler(d *stall.Detector, log zerolog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if d == nil {
			http.Error(w, `the stall detector is off ([stall] threshold = "off"): there is no recorder to start`, http.StatusConflict)
			return
		}
		var st stallTraceState
		switch r.Method {
		case http.MethodGet:
			st.Trace = d.Recording()
		case http.MethodPost:
			// The field may come in the query string or a form body, as
			// for /debug/faults.
			if err := r.ParseForm(); err != nil {
				http.Error(w, "bad form: "+err.Error(), http.StatusBadRequest)
				return
			}
			if !r.Form.Has("on") {
				http.Error(w, "POST on=true or on=false", http.StatusBadRequest)
				return
			}
			on, err := strconv.ParseBool(r.FormValue("on"))
			if err != nil {
				http.Error(w, fmt.Sprintf("on=%q: want true or false", r.FormValue("on")), http.StatusBadRequest)
				return
			}
			changed, err := d.SetRecording(on)
			if err != nil {
				http.Error(w, "the flight recorder: "+err.Error(), http.StatusInternalServerError)
				return
			}
			if changed {
				log.Info().Bool("trace", on).Msg("stall flight recorder switched from the admin endpoint")
			}
			st = stallTraceState{Trace: d.Recording(), Changed: changed}
		default:
			http.Error(w, "GET, or POST on=true|false", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	}
}
