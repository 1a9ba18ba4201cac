// Package siphash is SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed
// 64-bit pseudo-random function, used by the replica runtime as the MAC of
// every consensus datagram and side-channel frame.
//
// Why SipHash: it is a MAC made for short inputs, with a 128-bit key, and
// it is nothing but 64-bit additions, rotations and XORs, so the accel
// plane can check it at line rate in hardware (a few pipelined rounds per
// 8-byte word), which AES-GCM or HMAC-SHA256 would not allow as cheaply.
// A 64-bit tag is a 1 in 2^64 forgery chance per try, far beyond what an
// attacker can send.
package siphash

import (
	"encoding/binary"
	"math/bits"
)

// KeyBytes is the key size.
const KeyBytes = 16

// Key is a SipHash key.
type Key struct{ k0, k1 uint64 }

// NewKey returns the key of 16 bytes b (little endian halves, as in the
// reference implementation).
func NewKey(b [KeyBytes]byte) Key {
	return Key{binary.LittleEndian.Uint64(b[0:8]), binary.LittleEndian.Uint64(b[8:16])}
}

// Sum64 is SipHash-2-4 of msg under k.
func (k Key) Sum64(msg []byte) uint64 {
	v0 := k.k0 ^ 0x736f6d6570736575
	v1 := k.k1 ^ 0x646f72616e646f6d
	v2 := k.k0 ^ 0x6c7967656e657261
	v3 := k.k1 ^ 0x7465646279746573
	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13)
		v1 ^= v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16)
		v3 ^= v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21)
		v3 ^= v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17)
		v1 ^= v2
		v2 = bits.RotateLeft64(v2, 32)
	}
	n := len(msg)
	for len(msg) >= 8 {
		m := binary.LittleEndian.Uint64(msg)
		v3 ^= m
		round()
		round()
		v0 ^= m
		msg = msg[8:]
	}
	var last [8]byte
	copy(last[:], msg)
	last[7] = byte(n)
	m := binary.LittleEndian.Uint64(last[:])
	v3 ^= m
	round()
	round()
	v0 ^= m
	v2 ^= 0xff
	round()
	round()
	round()
	round()
	return v0 ^ v1 ^ v2 ^ v3
}
