package main

// GET /snapshot on the admin endpoint: a backup file (kv/backup) of the
// whole cluster's state, served by the leader.
//
// Why the admin endpoint and not the client protocol: a backup holds every
// tenant's keys and the exactly-once table, so it is an operator's
// action, authorised by the admin token, never by a tenant token (the
// client protocol authenticates tenants and confines each to its own
// keyspace). And a backup is a long byte stream, which HTTP carries as it
// is, while the client protocol's frames stop at FrameBytesMax (4 MiB) and
// would need a chunking protocol of their own.
//
// Why the leader: it answers the request only after a read barrier (the
// same one a linearizable read takes), so the snapshot holds every write
// acknowledged before the request arrived, on any node.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"synod/kv/backup"
	"synod/kv/replica"
	"synod/kv/sm"
)

// Limits of GET /snapshot.
const (
	// snapshotsInflightMax: one stream at a time per node; another
	// request meanwhile gets 429. A stream holds a Pebble snapshot open
	// (the files it covers cannot be compacted away) until it ends.
	snapshotsInflightMax = 1
	// snapshotBarrierTimeout bounds the read barrier before the stream.
	snapshotBarrierTimeout = 5 * time.Second
	// snapshotWriteStallMax bounds how long one write of the stream may
	// wait for the client to read: a client that stops reading does not
	// hold the Pebble snapshot for ever.
	snapshotWriteStallMax = 30 * time.Second
	// snapshotPath is the admin path.
	snapshotPath = "/snapshot"
)

// Response headers of GET /snapshot (also in the file's header).
const (
	headerSnapshotSlot    = "X-Synod-Slot"
	headerSnapshotCluster = "X-Synod-Cluster"
	headerSnapshotLeader  = "X-Synod-Leader" // on 409: the leader's node id, when known
)

// snapshotHandler serves GET /snapshot from rep and its state machine
// store, for cluster clusterID.
func snapshotHandler(rep *replica.Replica, store *sm.SM, clusterID uint64, log zerolog.Logger) http.Handler {
	var inflight atomic.Int32
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "GET "+snapshotPath+" streams a backup file", http.StatusMethodNotAllowed)
			return
		}
		if inflight.Add(1) > snapshotsInflightMax {
			inflight.Add(-1)
			http.Error(w, "a snapshot is already being streamed from this node; try again when it ends", http.StatusTooManyRequests)
			return
		}
		defer inflight.Add(-1)

		ctx, cancel := context.WithTimeout(r.Context(), snapshotBarrierTimeout)
		err := rep.ReadBarrier(ctx)
		cancel()
		var nl *replica.NotLeaderError
		switch {
		case errors.As(err, &nl):
			if nl.Leader != 0 {
				w.Header().Set(headerSnapshotLeader, strconv.FormatUint(uint64(nl.Leader), 10))
			}
			http.Error(w, fmt.Sprintf("not the leader (leader: node %d, client address %q): ask the leader's admin endpoint", nl.Leader, nl.ClientAddr),
				http.StatusConflict)
			return
		case err != nil:
			http.Error(w, fmt.Sprintf("no read barrier, so no consistent snapshot: %v", err), http.StatusServiceUnavailable)
			return
		}
		// Everything acknowledged before the request is applied here now;
		// the snapshot is of the state at this moment or later.
		stream, slot, err := store.Snapshot()
		if err != nil {
			http.Error(w, fmt.Sprintf("taking the snapshot: %v", err), http.StatusServiceUnavailable)
			return
		}
		defer stream.Close()
		h := backup.Header{ClusterID: clusterID, Slot: slot, Created: time.Now(), Members: backup.MemberIDs(rep.Status().Members)}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="synod-%d-%d.backup"`, clusterID, slot))
		w.Header().Set(headerSnapshotSlot, strconv.FormatUint(slot, 10))
		w.Header().Set(headerSnapshotCluster, strconv.FormatUint(clusterID, 10))
		start := time.Now()
		n, err := backup.Write(&stallWriter{w: w, rc: http.NewResponseController(w)}, h, stream)
		if err != nil {
			// Past the status line: end the connection without the
			// trailer, so the client sees the stream cut (and a saved
			// file would not verify).
			log.Warn().Err(err).Uint64("slot", slot).Int64("bytes", n).Msg("snapshot stream aborted")
			panic(http.ErrAbortHandler)
		}
		log.Info().Uint64("slot", slot).Int64("bytes", n).Dur("took", time.Since(start)).Str("remote", r.RemoteAddr).Msg("snapshot streamed")
	})
}

// stallWriter gives every write snapshotWriteStallMax to be taken.
type stallWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (s *stallWriter) Write(p []byte) (int, error) {
	s.rc.SetWriteDeadline(time.Now().Add(snapshotWriteStallMax))
	return s.w.Write(p)
}
