package wasi

import (
	"context"
	"sync"
)

// budget is the memory all running modules of a Runtime may hold at once
// (Options.MemoryBudget): each run takes its limit before it starts,
// queued in arrival order until that fits; its buffers are charged against
// what it took, and a growth past that is refused (memory.grow fails in
// the guest). A run gives everything back when it ends.
type budget struct {
	total uint64

	mu      sync.Mutex
	used    uint64
	peak    uint64
	waiters []*budgetWaiter // FIFO
}

type budgetWaiter struct {
	n     uint64
	ready chan struct{} // closed once n is taken for the waiter
}

// acquire takes n, waiting behind earlier waiters until it fits or ctx
// ends. n must be at most total.
func (b *budget) acquire(ctx context.Context, n uint64) error {
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.total {
		b.take(n)
		b.mu.Unlock()
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		select {
		case <-w.ready: // taken meanwhile: give it back
			b.mu.Unlock()
			b.release(n)
			return ctx.Err()
		default:
		}
		for i, x := range b.waiters {
			if x == w {
				b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
				break
			}
		}
		b.wakeLocked() // a large waiter leaving may unblock smaller ones
		b.mu.Unlock()
		return ctx.Err()
	}
}

// tryAcquire takes n if it fits now. Growth of a running module does not
// queue: it is refused instead, and the guest sees memory.grow fail.
func (b *budget) tryAcquire(n uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.total {
		return false
	}
	b.take(n)
	return true
}

func (b *budget) release(n uint64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	b.wakeLocked()
}

// wakeLocked admits waiters, in order, while the first one fits.
func (b *budget) wakeLocked() {
	for len(b.waiters) > 0 && b.used+b.waiters[0].n <= b.total {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.take(w.n)
		close(w.ready)
	}
}

func (b *budget) take(n uint64) {
	b.used += n
	b.peak = max(b.peak, b.used)
}

// MemoryStats describe the Runtime's memory budget.
type MemoryStats struct {
	Budget  uint64 // Options.MemoryBudget; 0: unbounded (the rest is then 0)
	InUse   uint64 // taken by the runs in flight
	Peak    uint64 // the most ever taken at once
	Waiting int    // runs queued for their minimum
}

// MemoryStats reports the budget's state.
func (r *Runtime) MemoryStats() MemoryStats {
	b := r.mem
	if b == nil {
		return MemoryStats{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return MemoryStats{Budget: b.total, InUse: b.used, Peak: b.peak, Waiting: len(b.waiters)}
}
