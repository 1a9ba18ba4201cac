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
	s := k.start()
	s.words(msg)
	rest := msg[len(msg)&^7:]
	return s.finish(lastWord(rest, len(msg)))
}

// Digest computes Sum64 of a message given in parts (Write), without
// joining them: Sum64 after writing a, then b, equals k.Sum64 of a and b
// concatenated. A sealer uses it to tag a header and a payload that lie in
// different buffers without copying the payload. The zero Digest is not
// usable; take one from Key.Digest.
type Digest struct {
	s     state
	tail  [8]byte // bytes written that do not yet make a whole word
	ntail int
	n     int // bytes written in all (the last word carries n mod 256)
}

// Digest returns a Digest under k with nothing written.
func (k Key) Digest() Digest { return Digest{s: k.start()} }

// Write adds p to the message.
func (d *Digest) Write(p []byte) {
	d.n += len(p)
	if d.ntail > 0 {
		c := copy(d.tail[d.ntail:], p)
		d.ntail += c
		p = p[c:]
		if d.ntail < len(d.tail) {
			return
		}
		d.s.words(d.tail[:])
		d.ntail = 0
	}
	whole := len(p) &^ 7
	d.s.words(p[:whole])
	d.ntail = copy(d.tail[:], p[whole:])
}

// Sum64 is the tag of everything written so far; d is unchanged.
func (d *Digest) Sum64() uint64 {
	s := d.s
	return s.finish(lastWord(d.tail[:d.ntail], d.n))
}

// state is SipHash's internal state.
type state struct{ v0, v1, v2, v3 uint64 }

func (k Key) start() state {
	return state{
		v0: k.k0 ^ 0x736f6d6570736575,
		v1: k.k1 ^ 0x646f72616e646f6d,
		v2: k.k0 ^ 0x6c7967656e657261,
		v3: k.k1 ^ 0x7465646279746573,
	}
}

// lastWord is the final word: the message's last len(rest) < 8 bytes and
// its total length n in the top byte.
func lastWord(rest []byte, n int) uint64 {
	var last [8]byte
	copy(last[:], rest)
	last[7] = byte(n)
	return binary.LittleEndian.Uint64(last[:])
}

// words absorbs the whole 8-byte words of msg (two compression rounds
// each) and ignores a shorter rest, which the caller keeps.
func (s *state) words(msg []byte) {
	v0, v1, v2, v3 := s.v0, s.v1, s.v2, s.v3
	for len(msg) >= 8 {
		m := binary.LittleEndian.Uint64(msg)
		v3 ^= m
		v0, v1, v2, v3 = round(v0, v1, v2, v3)
		v0, v1, v2, v3 = round(v0, v1, v2, v3)
		v0 ^= m
		msg = msg[8:]
	}
	s.v0, s.v1, s.v2, s.v3 = v0, v1, v2, v3
}

// finish absorbs the last word and runs the four finalization rounds.
func (s *state) finish(m uint64) uint64 {
	v0, v1, v2, v3 := s.v0, s.v1, s.v2, s.v3
	v3 ^= m
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0 ^= m
	v2 ^= 0xff
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	v0, v1, v2, v3 = round(v0, v1, v2, v3)
	return v0 ^ v1 ^ v2 ^ v3
}

// round is one SipRound.
func round(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
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
	return v0, v1, v2, v3
}
