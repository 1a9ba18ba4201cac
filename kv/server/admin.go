package server

import (
	"crypto/sha256"
	"crypto/subtle"

	"synod/kv/proto"
)

// Membership operations (proto.Opcode.IsMember: MEMBER_LIST, MEMBER_ADD,
// MEMBER_REMOVE, MEMBER_PROMOTE, TRANSFER_LEADER) are operator requests.
// A tenant token opens the connection as for any request, but the request
// itself must carry the node's admin token (Config.AdminToken, kvnode's
// [admin] token): a tenant's credential never changes the membership. The
// token is checked here, before the request reaches the backend; a wrong
// or missing one is answered UNAUTHORIZED and the connection stays open.
// A node configured without an admin token refuses them all.

// adminCheck holds what memberRefusal compares against: the SHA-256 of the
// admin token, so that neither its content nor its length shows in the
// comparison's timing.
type adminCheck struct {
	sum [sha256.Size]byte
	on  bool
}

func newAdminCheck(token string) adminCheck {
	return adminCheck{sum: sha256.Sum256([]byte(token)), on: token != ""}
}

// memberRefusal returns why req may not run ("" when it may): only
// membership operations are checked.
func (s *Server) memberRefusal(req *proto.Request) string {
	if !req.Op.IsMember() {
		return ""
	}
	if !s.admin.on {
		return "membership operations need the node's admin token, and this node has none ([admin] token)"
	}
	got := sha256.Sum256([]byte(req.AdminToken))
	if subtle.ConstantTimeCompare(got[:], s.admin.sum[:]) != 1 {
		return "wrong admin token (membership operations take the node's [admin] token, not a tenant token)"
	}
	return ""
}
