package proto

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestMemberRequestsRefuseMalformed: a membership request without an
// admin token, with member id 0 or without addresses is malformed, one over
// a length limit too large.
func TestMemberRequestsRefuseMalformed(t *testing.T) {
	long := strings.Repeat("a", AddrBytesMax+1)
	cases := map[string]*Request{
		"no admin token":       {Op: OpMemberList, Tenant: 7},
		"token too long":       {Op: OpMemberList, Tenant: 7, AdminToken: strings.Repeat("t", AdminTokenBytesMax+1)},
		"add id 0":             {Op: OpMemberAdd, Tenant: 7, AdminToken: "t", ConsensusAddr: "a:1", ClientAddr: "a:2"},
		"add no consensus":     {Op: OpMemberAdd, Tenant: 7, AdminToken: "t", MemberID: 4, ClientAddr: "a:2"},
		"add no client":        {Op: OpMemberAdd, Tenant: 7, AdminToken: "t", MemberID: 4, ConsensusAddr: "a:1"},
		"add address too long": {Op: OpMemberAdd, Tenant: 7, AdminToken: "t", MemberID: 4, ConsensusAddr: long, ClientAddr: "a:2"},
		"remove id 0":          {Op: OpMemberRemove, Tenant: 7, AdminToken: "t"},
		"promote id 0":         {Op: OpMemberPromote, Tenant: 7, AdminToken: "t"},
		"transfer id 0":        {Op: OpTransferLeader, Tenant: 7, AdminToken: "t"},
		"add id 64":            {Op: OpMemberAdd, Tenant: 7, AdminToken: "t", MemberID: MemberIDMax + 1, ConsensusAddr: "a:1", ClientAddr: "a:2"},
		"remove id 64":         {Op: OpMemberRemove, Tenant: 7, AdminToken: "t", MemberID: MemberIDMax + 1},
		"promote id 2^63":      {Op: OpMemberPromote, Tenant: 7, AdminToken: "t", MemberID: 1 << 63},
		"transfer id 64":       {Op: OpTransferLeader, Tenant: 7, AdminToken: "t", MemberID: MemberIDMax + 1},
	}
	for name, req := range cases {
		want := ErrMalformed
		if strings.Contains(name, "too long") {
			want = ErrTooLarge // a length over its limit is TOO_LARGE
		}
		if _, _, err := DecodeFrame(AppendRequest(nil, req)); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	// The largest id decodes.
	for _, op := range []Opcode{OpMemberAdd, OpMemberRemove, OpMemberPromote, OpTransferLeader} {
		req := &Request{Op: op, Tenant: 7, AdminToken: "t", MemberID: MemberIDMax, ConsensusAddr: "a:1", ClientAddr: "a:2"}
		if _, _, err := DecodeFrame(AppendRequest(nil, req)); err != nil {
			t.Errorf("%v id %d: %v", op, MemberIDMax, err)
		}
	}
	// Trailing bytes after a complete body.
	frame := AppendRequest(nil, &Request{Op: OpMemberRemove, Tenant: 7, AdminToken: "t", MemberID: 3})
	frame = append(frame, 0)
	frame[3]++
	if _, _, err := DecodeFrame(frame); !errors.Is(err, ErrMalformed) {
		t.Errorf("trailing byte: %v", err)
	}
}

// TestMembershipReplyRefusesMalformed: unknown flags, a commit index on an
// untracked member, more members than the limit and truncation are
// refused.
func TestMembershipReplyRefusesMalformed(t *testing.T) {
	good := AppendResponse(nil, &Response{Op: OpMemberList, Tenant: 7, ID: 1, Membership: &MembershipReply{Leader: 1, Members: []MemberInfo{
		{ID: 1, ConsensusAddr: "a:1", ClientAddr: "a:2", Tracked: true, Commit: 5}}}})
	body := HeaderBytes + 8 + 8 // the reply's flags byte
	member := body + 1 + 2      // the first member
	mutate := func(f func(b []byte)) []byte { b := bytes.Clone(good); f(b); return b }
	cases := map[string][]byte{
		"reply flags":      mutate(func(b []byte) { b[body] = 0x80 }),
		"member flags":     mutate(func(b []byte) { b[member+8] = 0x80 }),
		"untracked commit": mutate(func(b []byte) { b[member+8] = 0 }),
		"member count":     mutate(func(b []byte) { b[body+1], b[body+2] = 0xff, 0xff }),
		"truncated":        func() []byte { b := bytes.Clone(good[:len(good)-1]); b[3]--; return b }(),
	}
	for name, frame := range cases {
		if _, _, err := DecodeResponseFrame(frame); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}
