// Package server is the TCP front end of synod's binary protocol
// (kv/proto): it authenticates each connection's tenant, reads pipelined
// frames, admits them (shaping hook) from the fixed header before decoding
// the body, hands requests to a Backend and writes responses back with
// coalesced flushes (one writer goroutine drains a channel of responses and
// flushes once per burst, the idea of valyala/fastrpc).
//
// A connection's life: HELLO (token) -> HELLO response with the tenant id,
// or UNAUTHORIZED and close. Then any number of requests, at most
// proto.InflightPerConnMax outstanding; each header must carry the
// authenticated tenant (else UNAUTHORIZED and close). A frame whose header
// cannot be decoded (unknown opcode, flags, oversized length) gets
// BAD_REQUEST or TOO_LARGE and the connection is closed, because the
// stream can no longer be trusted; a body that does not decode gets
// BAD_REQUEST and the connection goes on. Other connections are never
// affected.
package server

import (
	"context"
	"time"

	"synod/kv/proto"
	"synod/tenants"
)

// Backend executes requests. The replica runtime implements it on top of
// consensus; kv/local implements it on a single state machine.
type Backend interface {
	// Do executes one request for an authenticated tenant and returns its
	// response (the server fills in Op, ID and Tenant). req.Op is one of
	// GET, PUT, DELETE, CAS, SCAN, BATCH, STATUS; req.Tenant equals tenant.
	// Writes are answered at commit; linearizable reads per the read path
	// (FlagStaleOK allows a local read). It must honour ctx: when ctx ends
	// it returns UNAVAILABLE (a write may still commit later; the client's
	// retry with the same (client id, seq) is answered from the
	// exactly-once table). Do is called concurrently.
	Do(ctx context.Context, tenant tenants.ID, req *proto.Request) *proto.Response
}

// Admitter decides, from the fixed header alone, whether a request may
// proceed. ok=false answers THROTTLED with retryAfter and skips the body.
// It is called on the connection's reader goroutine and must not block.
type Admitter interface {
	Admit(tenant tenants.ID, op proto.Opcode, frameBytes int) (ok bool, retryAfter time.Duration)
}

// Defaults and limits of the server.
const (
	RequestTimeoutDefault   = 5 * time.Second
	HandshakeTimeoutDefault = 5 * time.Second
	WriteTimeoutDefault     = 10 * time.Second
	ConnsMaxDefault         = 1024
	readBufferBytes         = 64 << 10
	writeBufferBytes        = 64 << 10
	// writeQueueFrames bounds the responses waiting for the writer: one per
	// in-flight request plus the few the reader answers itself.
	writeQueueFrames = proto.InflightPerConnMax + 8
)

// Config configures a Server. Zero values pick the defaults.
type Config struct {
	// RequestTimeout bounds one Backend.Do call (its ctx deadline).
	RequestTimeout time.Duration
	// HandshakeTimeout bounds the time from accept to a valid HELLO.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds one flush to a slow client; past it the
	// connection is closed.
	WriteTimeout time.Duration
	// ConnsMax bounds open connections; extra ones are closed at accept.
	ConnsMax int
	// Admitter is the admission hook; nil admits everything.
	Admitter Admitter
}

func (c Config) withDefaults() Config {
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = RequestTimeoutDefault
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = HandshakeTimeoutDefault
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = WriteTimeoutDefault
	}
	if c.ConnsMax <= 0 {
		c.ConnsMax = ConnsMaxDefault
	}
	return c
}
