package wasi

import (
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// pageSize is the size of a WebAssembly page.
const pageSize = 64 << 10

// limiter enforces one run's memory limit. wazero's own limit
// (RuntimeConfig.WithMemoryLimitPages) is decided when a module is
// compiled, which would tie each compiled module to one limit; an
// allocator is installed per instantiation instead, so one compiled module
// serves every limit. It also tells a refused memory.grow from any other
// failure, which is what lets Run report the limit rather than whatever
// the guest's runtime prints when its allocator fails.
//
// Buffers are slices from a pool of zeroed buffers that earlier runs gave
// back. Measured on a warm Go guest: fresh slices spent half of Run's CPU
// clearing and copying memory, and a PROT_NONE mapping opened with
// mprotect was slower still (first-touch page faults while wazero copies
// the data segments).
type limiter struct {
	limit  uint64        // bytes
	peak   atomic.Uint64 // bytes, largest size handed out
	denied atomic.Uint64 // bytes, largest size refused; 0 if none

	// budget, if set, is the Runtime's budget for all running modules:
	// every buffer handed out is charged to it (held), beyond what the
	// run took before it started (charged grows to cover held), and
	// recycle gives all of it back. overBudget: a grow was refused by the
	// budget, not by limit.
	budget        *budget
	charged, held uint64
	discarded     uint64 // outgrown buffers left to the garbage collector
	overBudget    atomic.Bool
	mems          []*linearMemory // Allocate runs on the guest's goroutine, like recycle
}

// charge counts a new buffer of capacity c against the budget; false if
// the budget cannot take it.
func (l *limiter) charge(c uint64) bool {
	if l.budget == nil {
		return true
	}
	if l.held+c > l.charged {
		if !l.budget.tryAcquire(l.held + c - l.charged) {
			return false
		}
		l.charged = l.held + c
	}
	l.held += c
	return true
}

var _ experimental.MemoryAllocator = (*limiter)(nil)

func (l *limiter) Allocate(capacity, _ uint64) experimental.LinearMemory {
	m := &linearMemory{l: l, capacity: capacity}
	l.mems = append(l.mems, m)
	return m
}

// note records a size handed out (ok) or refused.
func (l *limiter) note(size uint64, ok bool) {
	v := &l.peak
	if !ok {
		v = &l.denied
	}
	if size > v.Load() {
		v.Store(size)
	}
}

// recycle gives the buffers of freed memories back to the pool. Run calls
// it once the module is closed and its call has returned, when no guest
// code can touch them; wazero's Free may come earlier (proc_exit frees
// from inside the call), so Free only marks them.
//
// It returns how many bytes of buffers the pool did not keep: the caller
// may hand them back to the system.
func (l *limiter) recycle() (dropped uint64) {
	put := func(b []byte) {
		if !putBuffer(b) {
			dropped += uint64(cap(b))
		}
	}
	for _, m := range l.mems {
		if m.freed {
			for _, b := range m.retired {
				put(b)
			}
			if m.buf != nil {
				put(m.buf)
			}
		} else {
			for _, b := range m.retired {
				dropped += uint64(cap(b))
			}
			dropped += uint64(cap(m.buf))
		}
		m.buf, m.retired = nil, nil
	}
	l.mems = nil
	if l.budget != nil {
		l.budget.release(l.charged)
		l.charged, l.held = 0, 0
	}
	dropped += l.discarded
	l.discarded = 0
	return dropped
}

// linearMemory grows like a slice, by doubling up to the limit, so a guest
// that grows one page at a time is not copied once per page.
type linearMemory struct {
	l        *limiter
	capacity uint64 // hint from wazero for the first allocation
	buf      []byte
	retired  [][]byte // outgrown buffers, recycled with buf
	freed    bool
}

func (m *linearMemory) Reallocate(size uint64) []byte {
	if size > m.l.limit {
		// wazero slices the first allocation without a nil check; Run
		// checks the declared minimum before instantiating and recovers
		// if a module hides it, so nil here is only seen by memory.grow,
		// which returns -1 to the guest.
		m.l.note(size, false)
		return nil
	}
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
	} else {
		want := min(max(size, m.capacity, 2*uint64(cap(m.buf))), m.l.limit)
		if !m.l.charge(bufferCap(want)) {
			// No room for the slack of doubling: try the size itself.
			if want = size; !m.l.charge(bufferCap(want)) {
				m.l.overBudget.Store(true)
				m.l.note(size, false)
				return nil
			}
		}
		b := getBuffer(size, want)
		copy(b, m.buf)
		switch {
		case m.buf == nil:
		case m.l.budget != nil:
			// Under a budget an outgrown buffer is not kept for the
			// pool: it goes to the garbage collector now, and what it
			// held is free for this run's (or another's) next growth.
			m.l.held -= uint64(cap(m.buf))
			m.l.discarded += uint64(cap(m.buf))
		default:
			m.retired = append(m.retired, m.buf)
		}
		m.buf = b
	}
	m.l.note(size, true)
	return m.buf
}

func (m *linearMemory) Free() { m.freed = true }

// The pool holds zeroed buffers of 8 MiB to 256 MiB capacity, in powers of
// two: smaller ones are cheap to make, larger ones too costly to keep. It
// keeps at most poolBytes (64 MiB: a warm Go guest's first buffers) in all: what runs grew to beyond that goes back
// to the Go heap when they end, and from there to the system, so a burst
// of large runs does not stay in the daemon.
const (
	minPooled = 8 << 20
	maxPooled = 256 << 20
	poolBytes = 64 << 20
)

var pool struct {
	sync.Mutex
	free  [6][][]byte // 8, 16, 32, 64, 128, 256 MiB
	bytes uint64
}

func poolIndex(capacity uint64) int {
	i := 0
	for c := uint64(minPooled); c < capacity; c <<= 1 {
		i++
	}
	return i
}

// bufferCap is the capacity getBuffer(size, want) returns.
func bufferCap(want uint64) uint64 {
	if want > maxPooled {
		return want
	}
	return uint64(minPooled) << poolIndex(max(want, minPooled))
}

// getBuffer returns a zeroed buffer of length size and capacity
// bufferCap(want).
func getBuffer(size, want uint64) []byte {
	if want > maxPooled {
		return make([]byte, size, want)
	}
	want = max(want, minPooled)
	i := poolIndex(want)
	pool.Lock()
	if n := len(pool.free[i]); n > 0 {
		b := pool.free[i][n-1]
		pool.free[i] = pool.free[i][:n-1]
		pool.bytes -= uint64(cap(b))
		pool.Unlock()
		return b[:size]
	}
	pool.Unlock()
	return make([]byte, size, uint64(minPooled)<<i)
}

// putBuffer clears b and keeps it if its capacity is a pooled class and
// the pool has room; it reports whether it kept it.
func putBuffer(b []byte) bool {
	c := uint64(cap(b))
	if c < minPooled || c > maxPooled || c&(c-1) != 0 {
		return false
	}
	pool.Lock()
	defer pool.Unlock()
	if pool.bytes+c > poolBytes {
		return false
	}
	clear(b[:len(b)]) // what lies beyond len was never handed out
	i := poolIndex(c)
	pool.free[i] = append(pool.free[i], b[:0])
	pool.bytes += c
	return true
}
