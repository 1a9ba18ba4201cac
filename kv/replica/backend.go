package replica

import (
	"context"
	"errors"
	"strconv"
	"time"

	"synod/kv/proto"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/paxos"
	"synod/tenants"
)

// busyRetryAfter is the retry-after sent with THROTTLED when a runtime
// queue is full.
const busyRetryAfter = 2 * time.Millisecond

// Backend serves client requests on a Replica and the state machine it
// applies to. Reads of the state machine go through it (not around it):
// they must not overlap a snapshot restore.
type Backend struct {
	r  *Replica
	sm *sm.SM
	// Tenants, when set, receives each request's service time (admission
	// to reply) per tenant.
	Tenants *tenants.Metrics
}

var _ server.Backend = (*Backend)(nil)

// NewBackend returns the server.Backend of r, whose state machine is s.
func NewBackend(r *Replica, s *sm.SM) *Backend { return &Backend{r: r, sm: s} }

// Do implements server.Backend. Writes are answered when applied on this
// node (the leader); GET and SCAN take a read barrier unless FlagStaleOK.
func (b *Backend) Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	start := time.Now()
	b.admitted(ctx, req.Op, start)
	resp := b.do(ctx, tenant, req)
	b.Tenants.ObserveService(tenant, time.Since(start))
	b.r.metrics.TenantOps.WithLabelValues(strconv.FormatUint(uint64(tenant), 10), req.Op.String(), resp.Status.String()).Inc()
	return resp
}

func (b *Backend) do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response {
	switch req.Op {
	case proto.OpPut, proto.OpDelete, proto.OpCAS, proto.OpBatch:
		res, err := b.r.WriteRequest(ctx, tenant, req)
		if err != nil {
			return b.errResponse(err)
		}
		return res.Response(req)
	case proto.OpGet, proto.OpScan:
		room := server.ValueRoom(ctx)
		if req.Flags&proto.FlagStaleOK == 0 {
			// A GET refused for room needs no barrier (kv/sm ReadRefusal);
			// a follower still answers NOT_LEADER first.
			if b.r.status.Load().Role == paxos.RoleLeader {
				if r := b.sm.ReadRefusal(ctx, tenant, req, room); r != nil {
					return r
				}
			}
			if err := b.r.ReadBarrier(ctx); err != nil {
				return b.errResponse(err)
			}
		}
		b.r.restoreMu.RLock()
		defer b.r.restoreMu.RUnlock()
		start := time.Now()
		resp := b.sm.ReadResponseWithin(ctx, tenant, req, room)
		b.r.readStageTook(rsStateMachine, time.Since(start), 0)
		return resp
	case proto.OpStatus:
		return &proto.Response{Cluster: b.clusterStatus(ctx, req.StatusFormat)}
	case proto.OpPing:
		return &proto.Response{}
	case proto.OpMemberList, proto.OpMemberAdd, proto.OpMemberRemove, proto.OpMemberPromote, proto.OpTransferLeader:
		return b.member(ctx, req) // members_backend.go
	}
	return proto.Errorf(proto.StatusBadRequest, "opcode %v not served", req.Op)
}

// admitted times a request's admission stage: from the server reading its
// header (server.ReceivedAt) to Do at start.
func (b *Backend) admitted(ctx context.Context, op proto.Opcode, start time.Time) {
	received, ok := server.ReceivedAt(ctx)
	if !ok {
		return
	}
	switch op {
	case proto.OpPut, proto.OpDelete, proto.OpCAS, proto.OpBatch:
		b.r.writeStageTook(wsAdmission, start.Sub(received), 0)
	case proto.OpGet, proto.OpScan:
		b.r.readStageTook(rsAdmission, start.Sub(received), 0)
	}
}

// errResponse maps runtime errors to protocol statuses.
func (b *Backend) errResponse(err error) *proto.Response {
	var nl *NotLeaderError
	switch {
	case errors.As(err, &nl):
		r := proto.Errorf(proto.StatusNotLeader, "%v", err)
		r.Leader = nl.ClientAddr
		return r
	case errors.Is(err, ErrTooLarge):
		return proto.Errorf(proto.StatusTooLarge, "%v", err)
	case errors.Is(err, ErrBusy):
		r := proto.Errorf(proto.StatusThrottled, "%v", err)
		r.RetryAfter = busyRetryAfter
		return r
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return proto.Errorf(proto.StatusUnavailable, "deadline passed; outcome unknown: %v", err)
	default: // ErrUnavailable, ErrLogFull, ErrStopped
		return proto.Errorf(proto.StatusUnavailable, "%v", err)
	}
}

// Protocol roles and paxos roles share numbering (clusterStatus converts
// one to the other); this line stops compiling if they diverge.
var _ = [1]struct{}{}[int(paxos.RoleLeader)-int(proto.RoleLeader)]
