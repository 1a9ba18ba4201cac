package client

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"

	"synod/kv/proto"
)

// rawGetServer is a binary-protocol server that answers HELLO, then every
// request with one GET answer of value, written from one frame encoded
// up front (only the header changes per answer): what it allocates per
// answer is a header, so a test can see what the client allocates.
func rawGetServer(t *testing.T, value []byte, requests *atomic.Int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	frame := proto.AppendResponse(nil, &proto.Response{Op: proto.OpGet, Value: value, HasValue: true})
	h, err := proto.DecodeHeader(frame)
	if err != nil {
		t.Fatal(err)
	}
	body := frame[proto.HeaderBytes:]
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				hb := make([]byte, proto.HeaderBytes)
				for first := true; ; first = false {
					if _, err := io.ReadFull(br, hb); err != nil {
						return
					}
					rh, err := proto.DecodeHeader(hb)
					if err != nil {
						return
					}
					if _, err := br.Discard(int(rh.Length)); err != nil {
						return
					}
					if first {
						nc.Write(proto.AppendResponse(nil, &proto.Response{Op: proto.OpHello, ID: rh.ID, Tenant: 3,
							Version: proto.Version, InflightPerConnMax: proto.InflightPerConnMax, FrameBytesMax: proto.FrameBytesMax}))
						continue
					}
					requests.Add(1)
					h.ID, h.Tenant = rh.ID, rh.Tenant
					if _, err := nc.Write(proto.AppendHeader(make([]byte, 0, proto.HeaderBytes), h)); err != nil {
						return
					}
					if _, err := nc.Write(body); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// allocated returns the bytes the process allocated while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestForwardWithinRoomReadsPast: ForwardWithin asks its room with the
// answer's body length before it reads the body; a refusal is the call's
// answer at once (no retry, though it is THROTTLED), the body is read
// past without being held (the client allocates far less than the
// value), and the connection's next answer is read right. A room that
// grants is asked once and the value arrives whole (and allocated: the
// measure sees a body read into memory).
func TestForwardWithinRoomReadsPast(t *testing.T) {
	value := bytes.Repeat([]byte("v"), proto.ValueBytesMax)
	var requests atomic.Int64
	addr := rawGetServer(t, value, &requests)
	c := dial(t, []string{addr}, Options{})
	ctx := context.Background()
	get := func() *proto.Request { return &proto.Request{Op: proto.OpGet, Key: []byte("k")} }
	// The connection is dialled, and its buffers allocated, before measuring.
	if _, err := c.Forward(ctx, get()); err != nil {
		t.Fatal(err)
	}
	var asked []int
	refusal := proto.Errorf(proto.StatusThrottled, "no room here")
	var resp *proto.Response
	var err error
	requests.Store(0)
	refusedAlloc := allocated(func() {
		resp, err = c.ForwardWithin(ctx, get(), func(n int) *proto.Response {
			asked = append(asked, n)
			return refusal
		})
	})
	if err != nil || resp != refusal {
		t.Fatalf("refused by its room: %+v, %v; want the room's refusal itself", resp, err)
	}
	if len(asked) != 1 || asked[0] < len(value) || requests.Load() != 1 {
		t.Fatalf("room asked %v, the server answered %d requests; want once, with at least the value's %d bytes, one request (no retry)", asked, requests.Load(), len(value))
	}
	asked = nil
	var granted *proto.Response
	grantedAlloc := allocated(func() {
		granted, err = c.ForwardWithin(ctx, get(), func(n int) *proto.Response {
			asked = append(asked, n)
			return nil
		})
	})
	if err != nil || granted.Status != proto.StatusOK || !bytes.Equal(granted.Value, value) || len(asked) != 1 {
		t.Fatalf("granted by its room: %v, %v, %d value bytes, room asked %v", granted.Status, err, len(granted.Value), asked)
	}
	if refusedAlloc > uint64(len(value))/4 || grantedAlloc < uint64(len(value)) {
		t.Fatalf("allocated %d bytes for a refused answer and %d for a granted one, of a %d-byte value: want under a quarter of it, and at least all of it", refusedAlloc, grantedAlloc, len(value))
	}
	t.Logf("forward within room: value_bytes=%d refused_alloc_bytes=%d granted_alloc_bytes=%d", len(value), refusedAlloc, grantedAlloc)
}
