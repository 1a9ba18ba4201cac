package sm

import "testing"

// TestAbandonIsACrash: Abandon leaves the store as a process crash would:
// what Flush made durable is there, with Applied() at that point, and
// what was applied after it is gone (the runtime replays it from the log).
func TestAbandonIsACrash(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	a := newApplier(t, s)
	a.apply(1, put("a", "1"))
	if _, err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	a.apply(1, put("b", "2"))
	if err := s.Abandon(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir)
	defer s.Close()
	if _, ok := mustGet(t, s, 1, "a"); !ok || s.Applied() != 1 {
		t.Fatalf("after the crash: a present %v, applied %d; want true and 1", ok, s.Applied())
	}
	if _, ok := mustGet(t, s, 1, "b"); ok {
		t.Fatal("a write applied after the last flush survived Abandon")
	}
}
