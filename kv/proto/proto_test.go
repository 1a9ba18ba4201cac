package proto

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"
)

func sampleRequests() []*Request {
	return []*Request{
		{Op: OpHello, ID: 1, Version: Version, Token: "secret-token-1"},
		{Op: OpPing, Tenant: 7, ID: 2},
		{Op: OpGet, Tenant: 7, ID: 3, Key: []byte("k")},
		{Op: OpGet, Flags: FlagStaleOK, Tenant: 7, ID: 3, Key: []byte("k")},
		{Op: OpPut, Tenant: 7, ID: 4, ClientID: 9, Seq: 5, FirstUnacked: 3, Key: []byte("key"), Value: []byte("value")},
		{Op: OpPut, Tenant: 7, ID: 4, ClientID: 9, Seq: 5, FirstUnacked: 5, Key: []byte("key"), Value: []byte{}},
		{Op: OpPut, Tenant: 7, ID: 4, ClientID: 9, Seq: SeqMax, FirstUnacked: SeqMax, Key: []byte("key"), Value: []byte("the largest seq")},
		{Op: OpDelete, Tenant: 7, ID: 5, ClientID: 9, Seq: 6, FirstUnacked: 6, Key: []byte("key")},
		{Op: OpCAS, Tenant: 7, ID: 6, ClientID: 9, Seq: 7, FirstUnacked: 7, Key: []byte("key"), ExpectPresent: true, Expect: []byte("old"), Value: []byte("new")},
		{Op: OpCAS, Tenant: 7, ID: 6, ClientID: 9, Seq: 7, FirstUnacked: 7, Key: []byte("key"), Expect: []byte{}, Value: []byte("new")},
		{Op: OpCAS, Tenant: 7, ID: 6, ClientID: 9, Seq: 7, FirstUnacked: 7, Key: []byte("key"), ExpectPresent: true, ExpectDigest: true, Expect: ValueDigest([]byte("old")), Value: []byte("new")},
		{Op: OpScan, Tenant: 7, ID: 7, Start: []byte("a"), End: []byte("z"), Limit: 10},
		{Op: OpScan, Tenant: 7, ID: 7, Start: []byte{}, End: []byte{}, Limit: ScanLimitMax},
		{Op: OpBatch, Tenant: 7, ID: 8, ClientID: 9, Seq: 8, FirstUnacked: 1, Ops: []BatchOp{
			{Op: OpPut, Key: []byte("a"), Value: []byte("1")},
			{Op: OpDelete, Key: []byte("b")},
			{Op: OpCAS, Key: []byte("c"), ExpectPresent: true, Expect: []byte("x"), Value: []byte("y")},
			{Op: OpCAS, Key: []byte("d"), ExpectPresent: true, ExpectDigest: true, Expect: ValueDigest([]byte("x")), Value: []byte{}},
		}},
		{Op: OpStatus, Tenant: 7, ID: 9},
		{Op: OpMemberList, Tenant: 7, ID: 10, AdminToken: "admin-token-0123456789"},
		{Op: OpMemberAdd, Tenant: 7, ID: 11, AdminToken: "admin-token-0123456789", MemberID: 4, ConsensusAddr: "10.0.0.4:7001", ClientAddr: "10.0.0.4:7000"},
		{Op: OpMemberRemove, Tenant: 7, ID: 12, AdminToken: "t", MemberID: 3},
		{Op: OpMemberPromote, Tenant: 7, ID: 13, AdminToken: "t", MemberID: 4},
		{Op: OpTransferLeader, Tenant: 7, ID: 14, AdminToken: "t", MemberID: 2},
	}
}

// normalize makes nil and empty slices compare equal, as they do on the wire.
func normalize(v any) any {
	rv := reflect.ValueOf(v).Elem()
	var walk func(reflect.Value)
	walk = func(f reflect.Value) {
		switch f.Kind() {
		case reflect.Slice:
			if f.Type().Elem().Kind() == reflect.Uint8 {
				if f.Len() == 0 && f.CanSet() {
					f.Set(reflect.Zero(f.Type()))
				}
				return
			}
			for i := 0; i < f.Len(); i++ {
				walk(f.Index(i))
			}
		case reflect.Struct:
			for i := 0; i < f.NumField(); i++ {
				walk(f.Field(i))
			}
		case reflect.Pointer:
			if !f.IsNil() {
				walk(f.Elem())
			}
		}
	}
	walk(rv)
	return v
}

func TestRequestRoundTrip(t *testing.T) {
	for _, req := range sampleRequests() {
		frame := AppendRequest(nil, req)
		got, n, err := DecodeFrame(frame)
		if err != nil {
			t.Fatalf("%v: %v", req.Op, err)
		}
		if n != len(frame) {
			t.Fatalf("%v: used %d of %d bytes", req.Op, n, len(frame))
		}
		if !reflect.DeepEqual(normalize(got), normalize(req)) {
			t.Fatalf("%v: round trip\n got %+v\nwant %+v", req.Op, got, req)
		}
	}
}

func sampleResponses() []*Response {
	return []*Response{
		{Op: OpHello, Tenant: 7, ID: 1, Version: Version, InflightPerConnMax: InflightPerConnMax, FrameBytesMax: FrameBytesMax},
		{Op: OpPing, Tenant: 7, ID: 2},
		{Op: OpGet, Tenant: 7, ID: 3, Value: []byte("v"), HasValue: true},
		{Op: OpGet, Tenant: 7, ID: 3, Status: StatusNotFound},
		{Op: OpPut, Tenant: 7, ID: 4},
		{Op: OpPut, Tenant: 7, ID: 4, Status: StatusNotLeader, Leader: "127.0.0.1:7000", Message: "follower"},
		{Op: OpPut, Tenant: 7, ID: 4, Status: StatusThrottled, RetryAfter: 1500 * time.Microsecond},
		{Op: OpCAS, Tenant: 7, ID: 5, Status: StatusCASMismatch, Value: []byte("cur"), HasValue: true},
		{Op: OpBatch, Tenant: 7, ID: 6, Status: StatusCASMismatch, FailedOp: 2},
		{Op: OpScan, Tenant: 7, ID: 7, Pairs: []KV{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: []byte{}}}, More: true},
		{Op: OpScan, Tenant: 7, ID: 7},
		{Op: OpStatus, Tenant: 7, ID: 8, Cluster: &ClusterStatus{Self: 2, LeaderID: 1, LeaderAddr: "a:1", Ballot: Ballot{Round: 3, Node: 1},
			Members: []MemberStatus{{ID: 1, Addr: "a:1", Role: RoleLeader, Ballot: Ballot{3, 1}, Commit: 10, Applied: 9, Reachable: true},
				{ID: 2, Addr: "a:2", Role: RoleFollower, Commit: 10, Applied: 10}}}},
		{Op: OpMemberAdd, Tenant: 7, ID: 9, Membership: &MembershipReply{Leader: 1, Slot: 40, Pending: true, Members: []MemberInfo{
			{ID: 1, ConsensusAddr: "10.0.0.1:7001", ClientAddr: "10.0.0.1:7000", Tracked: true, Reachable: true, Commit: 41},
			{ID: 4, Learner: true, ConsensusAddr: "10.0.0.4:7001", ClientAddr: "10.0.0.4:7000", Tracked: true, Commit: 3},
			{ID: 5, ConsensusAddr: "c", ClientAddr: "d"}}}},
		{Op: OpMemberList, Tenant: 7, ID: 10, Membership: &MembershipReply{}},
		{Op: OpMemberPromote, Tenant: 7, ID: 11, Status: StatusConflict, Message: "learner 4 is behind"},
	}
}

func TestResponseRoundTrip(t *testing.T) {
	for _, resp := range sampleResponses() {
		frame := AppendResponse(nil, resp)
		got, n, err := DecodeResponseFrame(frame)
		if err != nil {
			t.Fatalf("%v %v: %v", resp.Op, resp.Status, err)
		}
		if n != len(frame) {
			t.Fatalf("used %d of %d bytes", n, len(frame))
		}
		if !reflect.DeepEqual(normalize(got), normalize(resp)) {
			t.Fatalf("%v %v: round trip\n got %+v\nwant %+v", resp.Op, resp.Status, got, resp)
		}
	}
}

func TestHeaderLayout(t *testing.T) {
	b := AppendHeader(nil, Header{Length: 0x01020304, Op: OpPut, Flags: FlagResponse, Status: StatusThrottled, Tenant: 0x0a0b0c0d, ID: 0x1112131415161718})
	want := []byte{1, 2, 3, 4, byte(OpPut), 1, byte(StatusThrottled), 0, 0x0a, 0x0b, 0x0c, 0x0d, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18}
	if !bytes.Equal(b, want) {
		t.Fatalf("header bytes %x, want %x", b, want)
	}
}

func TestMalformed(t *testing.T) {
	put := AppendRequest(nil, &Request{Op: OpPut, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: []byte("v")})
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(put)) }
	cases := []struct {
		name  string
		frame []byte
		large bool
	}{
		{"short header", put[:10], false},
		{"truncated body", put[:len(put)-1], false},
		{"unknown opcode", mutate(func(b []byte) []byte { b[4] = 99; return b }), false},
		{"unknown flag", mutate(func(b []byte) []byte { b[5] = 0x80; return b }), false},
		{"reserved byte", mutate(func(b []byte) []byte { b[7] = 1; return b }), false},
		{"status on request", mutate(func(b []byte) []byte { b[6] = 1; return b }), false},
		{"response flag on request", mutate(func(b []byte) []byte { b[5] = 1; return b }), false},
		{"length over limit", mutate(func(b []byte) []byte { b[0] = 0xff; return b }), true},
		{"trailing bytes", func() []byte {
			b := append(bytes.Clone(put), 0)
			b[3]++
			return b
		}(), false},
		{"client id zero", AppendRequest(nil, &Request{Op: OpPut, Tenant: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k")}), false},
		{"seq zero", AppendRequest(nil, &Request{Op: OpPut, Tenant: 1, ClientID: 1, FirstUnacked: 1, Key: []byte("k")}), false},
		{"seq above SeqMax", AppendRequest(nil, &Request{Op: OpPut, Tenant: 1, ClientID: 1, Seq: SeqMax + 1, FirstUnacked: 1, Key: []byte("k")}), false},
		{"first unacked above seq", AppendRequest(nil, &Request{Op: OpPut, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 2, Key: []byte("k")}), false},
		{"empty key", AppendRequest(nil, &Request{Op: OpPut, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1}), false},
		{"key too long", AppendRequest(nil, &Request{Op: OpGet, Tenant: 1, Key: make([]byte, KeyBytesMax+1)}), true},
		{"value too long", AppendRequest(nil, &Request{Op: OpPut, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Value: make([]byte, ValueBytesMax+1)}), true},
		{"scan limit zero", AppendRequest(nil, &Request{Op: OpScan, Tenant: 1}), false},
		{"scan limit too big", AppendRequest(nil, &Request{Op: OpScan, Tenant: 1, Limit: ScanLimitMax + 1}), false},
		{"empty batch", AppendRequest(nil, &Request{Op: OpBatch, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1}), false},
		{"batch too big", AppendRequest(nil, &Request{Op: OpBatch, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Ops: make([]BatchOp, BatchOpsMax+1)}), false},
		{"get in batch", AppendRequest(nil, &Request{Op: OpBatch, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Ops: []BatchOp{{Op: OpGet, Key: []byte("k")}}}), false},
		{"stale flag on write", AppendRequest(nil, &Request{Op: OpPut, Flags: FlagStaleOK, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k")}), false},
		{"cas absent with expect", AppendRequest(nil, &Request{Op: OpCAS, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"), Expect: []byte("x")}), false},
		{"unknown expect byte", func() []byte {
			b := AppendRequest(nil, &Request{Op: OpCAS, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k")})
			b[HeaderBytes+24+2+1] = 3
			return b
		}(), false},
		{"digest too short", AppendRequest(nil, &Request{Op: OpCAS, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"),
			ExpectPresent: true, ExpectDigest: true, Expect: make([]byte, ExpectDigestBytes-1)}), false},
		{"digest too long", AppendRequest(nil, &Request{Op: OpCAS, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1, Key: []byte("k"),
			ExpectPresent: true, ExpectDigest: true, Expect: make([]byte, ExpectDigestBytes+1)}), false},
		{"digest in a batch, empty", AppendRequest(nil, &Request{Op: OpBatch, Tenant: 1, ClientID: 1, Seq: 1, FirstUnacked: 1,
			Ops: []BatchOp{{Op: OpCAS, Key: []byte("k"), ExpectPresent: true, ExpectDigest: true}}}), false},
	}
	for _, tc := range cases {
		_, _, err := DecodeFrame(tc.frame)
		if err == nil {
			t.Errorf("%s: decoded without error", tc.name)
			continue
		}
		if got := errors.Is(err, ErrTooLarge); got != tc.large {
			t.Errorf("%s: too-large=%v, want %v (%v)", tc.name, got, tc.large, err)
		}
		if !tc.large && !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error does not wrap ErrMalformed: %v", tc.name, err)
		}
	}
}

// FuzzDecodeFrame checks that no input panics the request decoder and that
// whatever decodes re-encodes to the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	for _, req := range sampleRequests() {
		f.Add(AppendRequest(nil, req))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, n, err := DecodeFrame(b)
		if err != nil {
			return
		}
		again := AppendRequest(nil, req)
		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", b[:n], again)
		}
	})
}

// FuzzDecodeResponse does the same for responses (the client decodes them).
func FuzzDecodeResponse(f *testing.F) {
	for _, resp := range sampleResponses() {
		f.Add(AppendResponse(nil, resp))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, n, err := DecodeResponseFrame(b)
		if err != nil {
			return
		}
		again := AppendResponse(nil, resp)
		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", b[:n], again)
		}
	})
}

// TestScanStartBoundary: a SCAN's start may be one byte longer than a key
// (the successor of a key of KeyBytesMax resumes a scan), not two; its end
// is a key.
func TestScanStartBoundary(t *testing.T) {
	for n := KeyBytesMax - 1; n <= ScanStartBytesMax+1; n++ {
		frame := AppendRequest(nil, &Request{Op: OpScan, Tenant: 1, Start: make([]byte, n), Limit: 1})
		_, _, err := DecodeFrame(frame)
		if want := n <= ScanStartBytesMax; (err == nil) != want || (!want && !errors.Is(err, ErrTooLarge)) {
			t.Fatalf("start of %d bytes: %v", n, err)
		}
		frame = AppendRequest(nil, &Request{Op: OpScan, Tenant: 1, End: make([]byte, n), Limit: 1})
		_, _, err = DecodeFrame(frame)
		if want := n <= KeyBytesMax; (err == nil) != want {
			t.Fatalf("end of %d bytes: %v", n, err)
		}
	}
}
