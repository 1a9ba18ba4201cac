package paxossim

import (
	"errors"
	"testing"
)

func TestCommandRoundTrip(t *testing.T) {
	for _, c := range []command{
		{Op: opPut, Client: 1, Seq: 1, Key: "x", Value: "v"},
		{Op: opAppend, Client: 7, Seq: 1 << 40, Key: "", Value: ""},
		{Op: opCAS, Client: 1<<32 - 1, Seq: 3, Key: "zz", Value: "new", Expect: "old"},
	} {
		got, err := decodeCommand(appendCommand(nil, &c))
		if err != nil || got != c {
			t.Fatalf("round trip of %+v: %+v, %v", c, got, err)
		}
	}
	good := appendCommand(nil, &command{Op: opPut, Client: 1, Seq: 1, Key: "x", Value: "v"})
	for i := range good {
		if _, err := decodeCommand(good[:i]); !errors.Is(err, errBadCommand) {
			t.Fatalf("truncated to %d bytes: err %v", i, err)
		}
	}
	bad := append([]byte{}, good...)
	bad[0] = byte(opGet) // gets are never logged
	if _, err := decodeCommand(bad); err == nil {
		t.Fatal("logged get accepted")
	}
}

func TestKVAppExactlyOnce(t *testing.T) {
	a := newKVApp()
	c := command{Op: opAppend, Client: 1, Seq: 1, Key: "x", Value: "a"}
	a.applyCommand(&c)
	a.applyCommand(&c) // a retry that also reached the log
	if a.data["x"] != "a" {
		t.Fatalf("duplicate applied twice: %q", a.data["x"])
	}
	cas := command{Op: opCAS, Client: 2, Seq: 1, Key: "x", Expect: "a", Value: "b"}
	a.applyCommand(&cas)
	if a.data["x"] != "b" || a.sessions[2].Result != resultTrue {
		t.Fatalf("cas: %q %+v", a.data["x"], a.sessions[2])
	}
	cas.Seq = 2
	a.applyCommand(&cas)
	if a.data["x"] != "b" || a.sessions[2].Result != resultFalse {
		t.Fatalf("failed cas: %q %+v", a.data["x"], a.sessions[2])
	}
	a.applied = 9
	b, err := decodeKVApp(a.encode())
	if err != nil || b.applied != 9 || b.hash() != a.hash() || b.data["x"] != "b" {
		t.Fatalf("snapshot round trip: %+v %v", b, err)
	}
	a.data["y"] = ""
	if b.hash() == a.hash() {
		t.Fatal("hash ignores a key")
	}
}

func FuzzDecodeCommand(f *testing.F) {
	f.Add(appendCommand(nil, &command{Op: opPut, Client: 1, Seq: 1, Key: "x", Value: "v"}))
	f.Add(appendCommand(nil, &command{Op: opCAS, Client: 2, Seq: 9, Key: "y", Value: "n", Expect: "o"}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCommand(b)
		if err != nil {
			return
		}
		again, err := decodeCommand(appendCommand(nil, &c))
		if err != nil || again != c {
			t.Fatalf("re-encoding %+v: %+v, %v", c, again, err)
		}
	})
}

func FuzzDecodeKVApp(f *testing.F) {
	a := newKVApp()
	a.applyCommand(&command{Op: opPut, Client: 1, Seq: 1, Key: "x", Value: "v"})
	a.applied = 3
	f.Add(a.encode())
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		app, err := decodeKVApp(b)
		if err != nil {
			return
		}
		again, err := decodeKVApp(app.encode())
		if err != nil || again.hash() != app.hash() || again.applied != app.applied {
			t.Fatalf("re-encoding changed the state: %v", err)
		}
	})
}
