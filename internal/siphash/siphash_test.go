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

// TestDigestEqualsSum64: a message written to a Digest in any two or three
// parts has the tag Sum64 gives it whole, at every length that crosses a
// word boundary or none; and Sum64 leaves the Digest as it was.
func TestDigestEqualsSum64(t *testing.T) {
	var kb [KeyBytes]byte
	for i := range kb {
		kb[i] = byte(3 * i)
	}
	k := NewKey(kb)
	msg := make([]byte, 300)
	for i := range msg {
		msg[i] = byte(i*7 + 1)
	}
	for n := 0; n <= 40; n++ {
		want := k.Sum64(msg[:n])
		for i := 0; i <= n; i++ {
			for j := i; j <= n; j++ {
				d := k.Digest()
				d.Write(msg[:i])
				d.Write(msg[i:j])
				if got := d.Sum64(); got != k.Sum64(msg[:j]) {
					t.Fatalf("parts [0:%d][%d:%d]: %#x, want %#x", i, i, j, got, k.Sum64(msg[:j]))
				}
				d.Write(msg[j:n])
				if got := d.Sum64(); got != want {
					t.Fatalf("length %d in parts [0:%d][%d:%d][%d:%d]: %#x, want %#x", n, i, i, j, j, n, got, want)
				}
			}
		}
	}
	// A long message after a header that is no whole number of words
	// (the sealer's case: a 36-byte header, then the payload).
	d := k.Digest()
	d.Write(msg[:36])
	d.Write(msg[36:])
	if got, want := d.Sum64(), k.Sum64(msg); got != want {
		t.Fatalf("36 + %d bytes: %#x, want %#x", len(msg)-36, got, want)
	}
}

func BenchmarkDigest_1MiB_after36(b *testing.B) {
	var kb [KeyBytes]byte
	k := NewKey(kb)
	msg := make([]byte, 1<<20)
	var hdr [36]byte
	b.SetBytes(int64(len(msg)))
	for i := 0; i < b.N; i++ {
		d := k.Digest()
		d.Write(hdr[:])
		d.Write(msg)
		d.Sum64()
	}
}
