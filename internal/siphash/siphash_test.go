package siphash

import "testing"

// vectors are the first outputs of the reference implementation's
// vectors.h (key 00 01 .. 0f, message 00 01 .. len-1), as little-endian
// 64-bit values.
var vectors = []uint64{
	0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a, 0x85676696d7fb7e2d,
	0xcf2794e0277187b7, 0x18765564cd99a68d, 0xcbc9466e58fee3ce, 0xab0200f58b01d137,
	0x93f5f5799a932462, 0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
	0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee, 0xa129ca6149be45e5,
}

func TestReferenceVectors(t *testing.T) {
	var kb [KeyBytes]byte
	for i := range kb {
		kb[i] = byte(i)
	}
	k := NewKey(kb)
	msg := make([]byte, len(vectors))
	for i := range msg {
		msg[i] = byte(i)
	}
	for n, want := range vectors {
		if got := k.Sum64(msg[:n]); got != want {
			t.Errorf("length %d: %#016x, want %#016x", n, got, want)
		}
	}
}

// TestKeySensitivity: one key bit changes the tag.
func TestKeySensitivity(t *testing.T) {
	var a, b [KeyBytes]byte
	b[15] = 1
	msg := []byte("synod consensus datagram")
	if NewKey(a).Sum64(msg) == NewKey(b).Sum64(msg) {
		t.Fatal("two keys gave the same tag")
	}
}

func BenchmarkSum64_1KiB(b *testing.B) {
	var kb [KeyBytes]byte
	k := NewKey(kb)
	msg := make([]byte, 1024)
	b.SetBytes(int64(len(msg)))
	for i := 0; i < b.N; i++ {
		k.Sum64(msg)
	}
}
