package resp

import (
	"bytes"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"synod/kv/proto"
	"synod/kv/server"
)

// TestLargeValuesReadThenWrite: the commands that read a key and then
// write on the condition that it still holds what was read (DEL, UNLINK,
// GETDEL, GETSET, SET XX/GET) work on values of any size a PUT may store.
// Their conditions carry the value's digest: with the value itself, DEL of
// a key holding more than about 512 KiB, or of two 600 KiB keys, was
// refused TOO_LARGE and the key could not be deleted over RESP (found by an
// outside check). GETSET's new value is bounded by what a CAS with a
// digest condition leaves of the request body, walked byte by byte.
func TestLargeValuesReadThenWrite(t *testing.T) {
	ts := startServer(t, server.Config{}, nil)
	c := goRedis(t, ts.addr, specAlpha.Token)
	ctx := ctxT(t)
	key := strings.Repeat("k", proto.KeyBytesMax)
	big := bytes.Repeat([]byte{'v'}, proto.ValueBytesMax)

	set := func(k string, v []byte) {
		t.Helper()
		if err := c.Set(ctx, k, v, 0).Err(); err != nil {
			t.Fatalf("SET %d-byte key, %d-byte value: %v", len(k), len(v), err)
		}
	}
	exists := func(k string) int64 {
		t.Helper()
		n, err := c.Exists(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// DEL of the largest key holding the largest value.
	set(key, big)
	if n, err := c.Del(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("DEL of a %d-byte value: %d, %v", len(big), n, err)
	}
	if exists(key) != 0 {
		t.Fatal("the key survived DEL")
	}
	// UNLINK of two values that together exceed a request body.
	half := bytes.Repeat([]byte{'h'}, 600<<10)
	set("a", half)
	set("b", half)
	if n, err := c.Unlink(ctx, "a", "b", "absent").Result(); err != nil || n != 2 {
		t.Fatalf("UNLINK of two 600 KiB values and an absent key: %d, %v", n, err)
	}
	// GETDEL answers the largest value and deletes it.
	set(key, big)
	if v, err := c.GetDel(ctx, key).Bytes(); err != nil || !bytes.Equal(v, big) {
		t.Fatalf("GETDEL of a %d-byte value: %d bytes, %v", len(big), len(v), err)
	}
	if exists(key) != 0 {
		t.Fatal("the key survived GETDEL")
	}
	// SET XX and SET GET over a large value with another large value.
	set("x", half)
	other := bytes.Repeat([]byte{'o'}, 600<<10)
	if err := c.SetXX(ctx, "x", other, 0).Err(); err != nil {
		t.Fatalf("SET XX of 600 KiB over 600 KiB: %v", err)
	}
	if v, err := c.SetArgs(ctx, "x", half, redis.SetArgs{Get: true}).Bytes(); err != nil || !bytes.Equal(v, other) {
		t.Fatalf("SET GET of 600 KiB over 600 KiB: %d bytes, %v", len(v), err)
	}

	// GETSET's largest new value: the request body is the write id, the
	// key, the expect byte, the digest and the value with their lengths.
	getsetMax := proto.RequestBodyBytesMax - (24 + 2 + len(key) + 1 + 4 + proto.ExpectDigestBytes + 4)
	set(key, big)
	for _, n := range []int{getsetMax - 1, getsetMax, getsetMax + 1} {
		v := bytes.Repeat([]byte{byte('0' + n%10)}, n)
		old, err := c.GetSet(ctx, key, v).Bytes()
		if n > getsetMax {
			if err == nil || !strings.Contains(err.Error(), "too large") {
				t.Fatalf("GETSET of %d bytes (max %d): %v, want too large", n, getsetMax, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("GETSET of %d bytes (max %d): %v", n, getsetMax, err)
		}
		if len(old) < getsetMax-1 {
			t.Fatalf("GETSET of %d bytes answered %d bytes", n, len(old))
		}
	}
}

// TestParseRedisInt: INCR's operand and stored value are integers as Redis
// reads them: no '+', no leading zero, no sign alone, within int64.
func TestParseRedisInt(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "7": 7, "-7": -7, "9223372036854775807": 1<<63 - 1, "-9223372036854775808": -1 << 63} {
		if got, err := parseRedisInt([]byte(in)); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-", "+5", "012", "-0", "-012", "00", " 1", "1 ", "1e3", "9223372036854775808", "0x10"} {
		if got, err := parseRedisInt([]byte(in)); err == nil {
			t.Errorf("%q parsed as %d; Redis refuses it", in, got)
		}
	}
}
