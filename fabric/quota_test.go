package fabric

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// TestQuotaGivesThePoolItsRoom: the executor's warm pool hears, after
// every change of the tally but an activation's (which adopts an idle
// container; startContainer tells the pool after it), how many more
// attempts could start, so that idle containers
// and live attempts together stay within MaxLiveAttempts; without a limit
// the pool is not capped.
func TestQuotaGivesThePoolItsRoom(t *testing.T) {
	q := newQuota(3, 0)
	var heard []int
	q.room = func(n int) { heard = append(heard, n) }
	q.changed()
	if !q.reserve(0) { // an activation takes a place
		t.Fatal("reserve")
	}
	q.bind("a", 0) // and becomes live
	if !q.reserve(0) || !q.reserve(0) {
		t.Fatal("reserve")
	}
	q.unreserve(0) // one activation failed before it started
	q.bind("b", 0)
	if !q.reserve(0) {
		t.Fatal("reserve")
	}
	q.bind("c", 0)
	if q.reserve(0) { // full: queued instead
		t.Fatal("reserve beyond the limit")
	}
	q.enqueue("e", 0)
	q.ended("a") // e starts in a's place
	q.ended("b")
	q.adopt("d", 0) // found live at recovery
	if want := []int{3, 1, 0, 1, 0}; !slices.Equal(heard, want) {
		t.Fatalf("room heard %v, want %v", heard, want)
	}

	u := newQuota(0, 0)
	heard = nil
	u.room = func(n int) { heard = append(heard, n) }
	u.reserve(0)
	u.bind("a", 0)
	u.changed()
	if want := []int{-1}; !slices.Equal(heard, want) {
		t.Fatalf("unlimited: room heard %v, want %v", heard, want)
	}
}

// TestQuotaRoomNeverStale: two changes of the tally tell the pool in
// turn; the room it hears last is the room after both, never the first
// change's number arriving after the second's (a pool sized to a stale,
// larger room holds an idle container beside a full quota). The first
// call to room is held until the second change has told the pool, or for
// a second when it cannot (it waits for the first): a slow machine can
// only make the test miss the race, never fail it.
func TestQuotaRoomNeverStale(t *testing.T) {
	q := newQuota(2, 0)
	var mu sync.Mutex
	var heard []int
	entered, release := make(chan struct{}), make(chan struct{})
	calls := 0
	q.room = func(n int) {
		mu.Lock()
		calls++
		hold := calls == 1
		mu.Unlock()
		if hold {
			close(entered)
			<-release
		}
		mu.Lock()
		heard = append(heard, n)
		mu.Unlock()
	}
	first, second := make(chan struct{}), make(chan struct{})
	go func() { defer close(first); q.adopt("a", 0) }() // room 1, held
	<-entered
	go func() { defer close(second); q.adopt("b", 0) }() // room 0
	select {
	case <-second:
	case <-time.After(time.Second):
	}
	close(release)
	<-first
	<-second
	if len(heard) != 2 || heard[1] != 0 {
		t.Fatalf("room heard %v, want the last to be 0 (two live attempts of 2)", heard)
	}
}
