//go:build !linux

package server

import "net"

// peerHungUp cannot tell a peer's hang-up from unread bytes here: a paced
// connection whose peer closed is noticed when its reader next reads.
func peerHungUp(net.Conn) bool { return false }
