package tenants

import (
	"errors"
	"testing"
)

// TestDRRRingGrowsToItsClassBound: a tenant's queue starts with a small
// ring, grows as its burst needs up to its class's bound
// (QueueItemsMaxByClass) keeping first-in first-out order across the ring's
// wrap, refuses past the bound, and gives the grown ring back once empty.
func TestDRRRingGrowsToItsClassBound(t *testing.T) {
	clk := newFakeClock()
	reg := testRegistry(t,
		Spec{ID: 1, Name: "bulk", Priority: ClassBulk},
		Spec{ID: 2, Name: "std", Priority: ClassStandard},
	)
	d := NewDRR[int](reg, DRRConfig{QueueItemsMaxByClass: [classCount]int{ClassStandard: 1000, ClassBulk: 40}}, clk.Now, nil)
	std := d.queues[2]
	if len(std.items) != drrRingItemsMin {
		t.Fatalf("a new queue's ring holds %d items, want %d", len(std.items), drrRingItemsMin)
	}
	// Wrap the small ring first (head moves), then grow it in a burst.
	next, want := 0, 0
	for range 10 {
		d.Enqueue(2, 10, next)
		next++
	}
	for range 6 {
		if v, _, _ := d.Dequeue(); v != want {
			t.Fatalf("dequeued %d, want %d", v, want)
		}
		want++
	}
	for next < 1000+6 {
		if err := d.Enqueue(2, 10, next); err != nil {
			t.Fatalf("item %d of a standard tenant bounded at 1000: %v", next-want, err)
		}
		next++
	}
	if err := d.Enqueue(2, 10, next); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("item 1001: %v, want ErrQueueFull", err)
	}
	if len(std.items) != 1000 {
		t.Fatalf("the ring grew to %d, want the bound 1000", len(std.items))
	}
	for d.Len() > 0 {
		v, _, _ := d.Dequeue()
		if v != want {
			t.Fatalf("dequeued %d, want %d: order lost across growth", v, want)
		}
		want++
	}
	if len(std.items) != drrRingItemsMin {
		t.Fatalf("an emptied queue keeps a ring of %d items, want it back to %d", len(std.items), drrRingItemsMin)
	}
	// The bulk tenant's bound is its class's.
	for i := range 40 {
		if err := d.Enqueue(1, 10, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Enqueue(1, 10, 40); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("bulk item 41: %v, want ErrQueueFull", err)
	}
}
