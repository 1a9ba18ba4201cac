package resp

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"synod/kv/server"
)

// TestGoRedisCommands drives every command with go-redis, over RESP2
// and RESP3 (go-redis's default).
func TestGoRedisCommands(t *testing.T) {
	ts := startServer(t, server.Config{}, nil)
	for _, protocol := range []int{2, 3} {
		t.Run(fmt.Sprintf("resp%d", protocol), func(t *testing.T) {
			rc := goRedis(t, ts.addr, specAlpha.Token, func(o *redis.Options) { o.Protocol = protocol })
			ctx := ctxT(t)
			p := fmt.Sprintf("p%d:", protocol)
			k := func(s string) string { return p + s }
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			must(rc.Ping(ctx).Err())
			if v, err := rc.Echo(ctx, "hi\r\nthere").Result(); err != nil || v != "hi\r\nthere" {
				t.Fatalf("ECHO: %q %v", v, err)
			}
			must(rc.Set(ctx, k("a"), "1", 0).Err())
			if v, err := rc.Get(ctx, k("a")).Result(); err != nil || v != "1" {
				t.Fatalf("GET a: %q %v", v, err)
			}
			if _, err := rc.Get(ctx, k("missing")).Result(); !errors.Is(err, redis.Nil) {
				t.Fatalf("GET missing: %v", err)
			}
			// SET NX / XX / GET.
			if ok, err := rc.SetNX(ctx, k("a"), "2", 0).Result(); err != nil || ok {
				t.Fatalf("SETNX on a present key: %v %v", ok, err)
			}
			if ok, err := rc.SetNX(ctx, k("b"), "2", 0).Result(); err != nil || !ok {
				t.Fatalf("SETNX on an absent key: %v %v", ok, err)
			}
			if ok, err := rc.SetXX(ctx, k("c"), "3", 0).Result(); err != nil || ok {
				t.Fatalf("SET XX on an absent key: %v %v", ok, err)
			}
			if ok, err := rc.SetXX(ctx, k("b"), "3", 0).Result(); err != nil || !ok {
				t.Fatalf("SET XX on a present key: %v %v", ok, err)
			}
			if v, err := rc.SetArgs(ctx, k("b"), "4", redis.SetArgs{Get: true}).Result(); err != nil || v != "3" {
				t.Fatalf("SET GET: %q %v", v, err)
			}
			if _, err := rc.SetArgs(ctx, k("new"), "x", redis.SetArgs{Get: true}).Result(); !errors.Is(err, redis.Nil) {
				t.Fatalf("SET GET on an absent key: %v", err)
			}
			if err := rc.Set(ctx, k("ttl"), "x", 1e9).Err(); err == nil || !strings.Contains(err.Error(), "expiry") {
				t.Fatalf("SET EX: %v", err)
			}
			if n, err := rc.Do(ctx, "SETNX", k("b"), "5").Int(); err != nil || n != 0 {
				t.Fatalf("SETNX command: %d %v", n, err)
			}
			if v, err := rc.GetSet(ctx, k("b"), "6").Result(); err != nil || v != "4" {
				t.Fatalf("GETSET: %q %v", v, err)
			}
			if v, err := rc.GetDel(ctx, k("b")).Result(); err != nil || v != "6" {
				t.Fatalf("GETDEL: %q %v", v, err)
			}
			if _, err := rc.GetDel(ctx, k("b")).Result(); !errors.Is(err, redis.Nil) {
				t.Fatalf("GETDEL of a deleted key: %v", err)
			}
			// MSET, MGET, EXISTS, DEL.
			must(rc.MSet(ctx, k("m1"), "v1", k("m2"), "v2", k("m3"), "v3").Err())
			if vs, err := rc.MGet(ctx, k("m1"), k("nope"), k("m3")).Result(); err != nil || vs[0] != "v1" || vs[1] != nil || vs[2] != "v3" {
				t.Fatalf("MGET: %v %v", vs, err)
			}
			if n, err := rc.Exists(ctx, k("m1"), k("m2"), k("nope"), k("m1")).Result(); err != nil || n != 3 {
				t.Fatalf("EXISTS: %d %v", n, err)
			}
			if n, err := rc.Del(ctx, k("m1"), k("m2"), k("nope")).Result(); err != nil || n != 2 {
				t.Fatalf("DEL: %d %v", n, err)
			}
			if n, err := rc.Unlink(ctx, k("m3")).Result(); err != nil || n != 1 {
				t.Fatalf("UNLINK: %d %v", n, err)
			}
			if n, err := rc.Del(ctx, k("m3")).Result(); err != nil || n != 0 {
				t.Fatalf("DEL of nothing: %d %v", n, err)
			}
			// INCR family.
			if n, err := rc.Incr(ctx, k("n")).Result(); err != nil || n != 1 {
				t.Fatalf("INCR: %d %v", n, err)
			}
			if n, err := rc.IncrBy(ctx, k("n"), 41).Result(); err != nil || n != 42 {
				t.Fatalf("INCRBY: %d %v", n, err)
			}
			if n, err := rc.Decr(ctx, k("n")).Result(); err != nil || n != 41 {
				t.Fatalf("DECR: %d %v", n, err)
			}
			if n, err := rc.DecrBy(ctx, k("n"), 50).Result(); err != nil || n != -9 {
				t.Fatalf("DECRBY: %d %v", n, err)
			}
			if err := rc.Incr(ctx, k("a")).Err(); err != nil {
				t.Fatalf("INCR of \"1\": %v", err)
			}
			must(rc.Set(ctx, k("word"), "abc", 0).Err())
			if err := rc.Incr(ctx, k("word")).Err(); err == nil || !strings.Contains(err.Error(), "not an integer") {
				t.Fatalf("INCR of a word: %v", err)
			}
			must(rc.Set(ctx, k("max"), "9223372036854775807", 0).Err())
			if err := rc.Incr(ctx, k("max")).Err(); err == nil || !strings.Contains(err.Error(), "overflow") {
				t.Fatalf("INCR past int64: %v", err)
			}
			// CAS.
			if n, err := rc.Do(ctx, "CAS", k("a"), "2", "3").Int(); err != nil || n != 1 {
				t.Fatalf("CAS match: %d %v", n, err)
			}
			if n, err := rc.Do(ctx, "CAS", k("a"), "2", "4").Int(); err != nil || n != 0 {
				t.Fatalf("CAS mismatch: %d %v", n, err)
			}
			if n, err := rc.Do(ctx, "CAS", k("absent"), "", "4").Int(); err != nil || n != 0 {
				t.Fatalf("CAS on an absent key: %d %v", n, err)
			}
			// Connection commands.
			must(rc.Do(ctx, "SELECT", "0").Err())
			if err := rc.Do(ctx, "SELECT", "1").Err(); err == nil {
				t.Fatal("SELECT 1 accepted")
			}
			if id, err := rc.ClientID(ctx).Result(); err != nil || id == 0 {
				t.Fatalf("CLIENT ID: %d %v", id, err)
			}
			must(rc.Do(ctx, "CLIENT", "SETNAME", "tester").Err())
			if info, err := rc.Info(ctx, "replication").Result(); err != nil || !strings.Contains(info, "role:master") || !strings.Contains(info, "member0:id=1") {
				t.Fatalf("INFO replication: %q %v", info, err)
			}
			if info, err := rc.Info(ctx).Result(); err != nil || !strings.Contains(info, "redis_version:") || !strings.Contains(info, "total_commands_processed:") {
				t.Fatalf("INFO: %q %v", info, err)
			}
			if n, err := rc.Do(ctx, "COMMAND", "COUNT").Int(); err != nil || n < 20 {
				t.Fatalf("COMMAND COUNT: %d %v", n, err)
			}
			if cmds, err := rc.Command(ctx).Result(); err != nil || cmds["get"] == nil || cmds["get"].Arity != 2 || !cmds["set"].ReadOnly == false {
				t.Fatalf("COMMAND: %v %v", cmds["get"], err)
			}
			if err := rc.Do(ctx, "FLUSHALL").Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
				t.Fatalf("FLUSHALL: %v", err)
			}
			if err := rc.Do(ctx, "GET").Err(); err == nil || !strings.Contains(err.Error(), "wrong number of arguments") {
				t.Fatalf("GET without a key: %v", err)
			}
			if err := rc.Set(ctx, "", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "empty key") {
				t.Fatalf("SET of the empty key: %v", err)
			}
		})
	}
}

// TestGoRedisScan pages through keys with SCAN MATCH prefix* COUNT n and
// go-redis's iterator; every key comes back exactly once.
func TestGoRedisScan(t *testing.T) {
	ts := startServer(t, server.Config{}, nil)
	rc := goRedis(t, ts.addr, specAlpha.Token)
	ctx := ctxT(t)
	want := map[string]bool{}
	for i := range 57 {
		k := fmt.Sprintf("user:%03d", i)
		want[k] = true
		if err := rc.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rc.Set(ctx, fmt.Sprintf("other:%03d", i), "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]int{}
	it := rc.Scan(ctx, 0, "user:*", 10).Iterator()
	for it.Next(ctx) {
		got[it.Val()]++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("SCAN returned %d keys, want %d", len(got), len(want))
	}
	for k, n := range got {
		if !want[k] || n != 1 {
			t.Fatalf("SCAN returned %q %d times", k, n)
		}
	}
	// All keys, default COUNT; a literal pattern; a bad pattern; a bad cursor.
	keys, cur, err := rc.Scan(ctx, 0, "", 1000).Result()
	if err != nil || len(keys) != 114 || cur != 0 {
		t.Fatalf("SCAN 0 COUNT 1000: %d keys, cursor %d, %v", len(keys), cur, err)
	}
	keys, _, err = rc.Scan(ctx, 0, "user:007", 10).Result()
	if err != nil || len(keys) != 1 || keys[0] != "user:007" {
		t.Fatalf("SCAN MATCH literal: %v %v", keys, err)
	}
	if _, _, err := rc.Scan(ctx, 0, "u*r", 10).Result(); err == nil {
		t.Fatal("SCAN MATCH u*r accepted")
	}
	if _, _, err := rc.Scan(ctx, 12345, "", 10).Result(); err == nil || !strings.Contains(err.Error(), "invalid cursor") {
		t.Fatalf("SCAN of an unknown cursor: %v", err)
	}
	// Another tenant sees none of alpha's keys.
	rb := goRedis(t, ts.addr, specBravo.Token)
	if keys, _, err := rb.Scan(ctx, 0, "", 1000).Result(); err != nil || len(keys) != 0 {
		t.Fatalf("bravo's SCAN: %v %v", keys, err)
	}
	if _, err := rb.Get(ctx, "user:001").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("bravo read alpha's key: %v", err)
	}
}
