package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"synod/kv/client"
	"synod/kv/proto"
)

// The attack suite: each attack is run against a real cluster by an
// ordinary tenant (or a raw socket), and the test asserts that it did no
// harm: every node still runs, the cluster still serves a write, and the
// data the attack aimed at is unchanged. One summary line counts them.

// attack is one hostile input and its harm check.
type attack struct {
	name string
	// run carries the attack out; it returns a description of any harm
	// it can see itself ("" for none).
	run func(t *testing.T, c *cluster, cl *client.Client) string
}

// TestAttacks runs every attack against one cluster, checking the
// cluster's health after each.
func TestAttacks(t *testing.T) {
	c := newCluster(t, 3)
	c.leader()
	cl := dialClient(t, c.endpoints(), tenantA.token, killClientRetries)
	defer cl.Close()
	tried, harmful := 0, 0
	before, err := c.status(c.leader())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range attacks() {
		tried++
		harm := a.run(t, c, cl)
		if harm == "" {
			harm = c.harmAfterAttack(cl, a.name)
		}
		if harm != "" {
			harmful++
			t.Errorf("attack %q did harm: %s", a.name, harm)
		}
	}
	// Elections over the whole suite (informative: only the overload
	// attack asserts none; the others judge their own harm). Before
	// paxos's liveness timers ignored the node's own stalls, the scan
	// flood alone set off election storms of five rounds.
	rounds := "unknown"
	if after, err := c.status(c.leader()); err == nil {
		rounds = fmt.Sprint(after.Promised[0] - before.Promised[0])
	}
	fmt.Printf("attacks: tried=%d harmful=%d ballot_rounds_gained=%s\n", tried, harmful, rounds)
}

// harmAfterAttack checks that every node still runs and the cluster still
// acknowledges a write and reads it back.
func (c *cluster) harmAfterAttack(cl *client.Client, name string) string {
	for _, nd := range c.nodes {
		if !nd.running() {
			return fmt.Sprintf("node %d exited (%v)", nd.id, nd.cmd.ProcessState)
		}
	}
	key := []byte("after/" + name)
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	if err := cl.Put(ctx, key, []byte("ok")); err != nil {
		return fmt.Sprintf("no write acknowledged afterwards: %v", err)
	}
	if v, err := cl.Get(ctx, key); err != nil || string(v) != "ok" {
		return fmt.Sprintf("a write afterwards did not read back: %q %v", v, err)
	}
	return ""
}

// attackSets are the attack lists of the suite's files (each registers its
// own in an init function), run in file-name order after sizeAttacks.
var attackSets []func() []attack

func attacks() []attack {
	all := sizeAttacks()
	for _, set := range attackSets {
		all = append(all, set()...)
	}
	return all
}

// sizeAttacks: oversized writes (the size chain, item 1 of the
// hostile-input review).
func sizeAttacks() []attack {
	return []attack{
		// Item 1 of the hostile-input review: one legal-looking PUT made
		// every leader it reached exit ("pmem: record too large").
		{"PUT 1-byte key, 1,048,480-byte value (killed leaders)", func(t *testing.T, c *cluster, cl *client.Client) string {
			return refusedUnchanged(cl, []byte("victim/put"), func() error {
				ctx, cancel := ctxTimeout(killOpTimeout)
				defer cancel()
				return cl.Put(ctx, []byte("victim/put"), make([]byte, 1048480))
			})
		}},
		{"PUT one byte over ValueBytesMax", func(t *testing.T, c *cluster, cl *client.Client) string {
			return refusedUnchanged(cl, []byte("victim/put"), func() error {
				ctx, cancel := ctxTimeout(killOpTimeout)
				defer cancel()
				return cl.Put(ctx, []byte("victim/put"), make([]byte, proto.ValueBytesMax+1))
			})
		}},
		{"CAS with expect and value each under ValueBytesMax, together over the record", func(t *testing.T, c *cluster, cl *client.Client) string {
			key := []byte("victim/cas")
			half := proto.RequestBodyBytesMax/2 + 1 // expect + value exceed the request body
			old := bytes.Repeat([]byte("e"), half)
			ctx, cancel := ctxTimeout(killOpTimeout)
			defer cancel()
			if err := cl.Put(ctx, key, old); err != nil {
				return fmt.Sprintf("setting up: %v", err)
			}
			return refusedUnchanged(cl, key, func() error {
				return cl.CAS(ctx, key, old, make([]byte, half))
			})
		}},
		{"BATCH of 4 near-limit PUTs (4 MiB)", func(t *testing.T, c *cluster, cl *client.Client) string {
			var ops []proto.BatchOp
			for i := 0; i < 4; i++ {
				ops = append(ops, proto.BatchOp{Op: proto.OpPut, Key: []byte(fmt.Sprintf("victim/batch%d", i)), Value: make([]byte, proto.ValueBytesMax-64)})
			}
			return refusedUnchanged(cl, []byte("victim/batch0"), func() error {
				ctx, cancel := ctxTimeout(killOpTimeout)
				defer cancel()
				return cl.Batch(ctx, ops)
			})
		}},
		{"PUT exactly at the limits (longest key, ValueBytesMax), five in a row", func(t *testing.T, c *cluster, cl *client.Client) string {
			key := bytes.Repeat([]byte("k"), proto.KeyBytesMax)
			for i := 0; i < 5; i++ {
				val := bytes.Repeat([]byte{byte('a' + i)}, proto.ValueBytesMax)
				ctx, cancel := ctxTimeout(3 * killOpTimeout)
				err := cl.Put(ctx, key, val)
				if err == nil {
					var got []byte
					got, err = cl.Get(ctx, key)
					if err == nil && !bytes.Equal(got, val) {
						err = errors.New("read back a different value")
					}
				}
				cancel()
				if err != nil {
					return fmt.Sprintf("a write at the limits failed: %v", err)
				}
			}
			return ""
		}},
	}
}

// refusedUnchanged runs an oversized write, which must be refused with
// TOO_LARGE and leave key as it was.
func refusedUnchanged(cl *client.Client, key []byte, write func() error) string {
	ctx, cancel := ctxTimeout(killOpTimeout)
	defer cancel()
	before, errBefore := cl.Get(ctx, key)
	err := write()
	if !errors.Is(err, client.ErrTooLarge) {
		return fmt.Sprintf("answered %v, want TOO_LARGE", err)
	}
	time.Sleep(10 * time.Millisecond)
	after, errAfter := cl.Get(ctx, key)
	if !bytes.Equal(before, after) || (errBefore == nil) != (errAfter == nil) {
		return fmt.Sprintf("the key changed: %d bytes (%v) -> %d bytes (%v)", len(before), errBefore, len(after), errAfter)
	}
	return ""
}
