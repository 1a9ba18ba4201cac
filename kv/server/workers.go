package server

import (
	"time"

	"synod/kv/proto"
)

// Request workers. Each admitted request runs on a goroutine of its own,
// so that a slow one (a write waiting for its quorum, a read for its read
// index) holds up nobody behind it on the connection. A new goroutine a
// request cost the leader 3-6 % of its CPU at 10,000 puts a second: the
// goroutine's creation, and copying its stack as the request's calls
// outgrew the starting size (docs/benchmarking.md, "Request goroutines
// kept"). A goroutine that finished a request therefore waits up to
// workerIdleMax for the next one, with the stack it grew; a request that
// finds none waiting starts a new one.
//
// Bound: a worker is either running a request (bounded by ConnsMax x
// proto.InflightPerConnMax, the slots) or waiting, for at most
// workerIdleMax; so the workers never outnumber the peak of concurrent
// requests within the last workerIdleMax.

// workerIdleMax is how long a worker waits for its next request before it
// exits.
const workerIdleMax = time.Second

// workItem is one admitted request and what c.do needs to run it.
type workItem struct {
	c        *conn
	req      *proto.Request
	held     int64
	body     int64
	received time.Time
}

// runRequest runs it on a waiting worker, or on a new one. The caller has
// counted the request in it.c.inflight.
func (s *Server) runRequest(it workItem) {
	if !s.noWorkers {
		select {
		case s.work <- it:
			return
		default:
		}
	}
	s.wg.Add(1)
	s.workersStarted.Add(1)
	go s.worker(it)
}

// worker runs it, then the requests handed to it, until it has waited
// workerIdleMax for one or the server closes.
func (s *Server) worker(it workItem) {
	defer s.wg.Done()
	s.workers.Add(1)
	defer s.workers.Add(-1)
	idle := time.NewTimer(workerIdleMax)
	defer idle.Stop()
	for {
		it.c.do(it.req, it.held, it.body, it.received)
		it = workItem{} // hold no request while waiting
		if s.noWorkers {
			return
		}
		idle.Reset(workerIdleMax)
		select {
		case it = <-s.work:
		case <-idle.C:
			return
		case <-s.ctx.Done():
			return
		}
	}
}

// testingNoWorkers, planted, makes the servers New returns run every
// request on a goroutine of its own that exits after it (the old way).
var testingNoWorkers bool
