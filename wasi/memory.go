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

	mems []*linearMemory // Allocate runs on the guest's goroutine, like recycle
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
func (l *limiter) recycle() {
	for _, m := range l.mems {
		if m.freed {
			for _, b := range m.retired {
				putBuffer(b)
			}
			if m.buf != nil {
				putBuffer(m.buf)
			}
		}
		m.buf, m.retired = nil, nil
	}
	l.mems = nil
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
		c := max(size, m.capacity, 2*uint64(cap(m.buf)))
		b := getBuffer(size, min(c, m.l.limit))
		copy(b, m.buf)
		if m.buf != nil {
			m.retired = append(m.retired, m.buf)
		}
		m.buf = b
	}
	m.l.note(size, true)
	return m.buf
}

func (m *linearMemory) Free() { m.freed = true }

// The pool holds zeroed buffers of 8 MiB to 256 MiB capacity, in powers of
// two: smaller ones are cheap to make, larger ones too costly to keep.
const (
	minPooled = 8 << 20
	maxPooled = 256 << 20
)

var pools [6]sync.Pool // 8, 16, 32, 64, 128, 256 MiB

func poolIndex(capacity uint64) int {
	i := 0
	for c := uint64(minPooled); c < capacity; c <<= 1 {
		i++
	}
	return i
}

// getBuffer returns a zeroed buffer of length size and capacity at least
// want (capacity is rounded up to a pooled class when it fits one).
func getBuffer(size, want uint64) []byte {
	if want > maxPooled {
		return make([]byte, size, want)
	}
	want = max(want, minPooled)
	i := poolIndex(want)
	if b, ok := pools[i].Get().(*[]byte); ok {
		return (*b)[:size]
	}
	return make([]byte, size, uint64(minPooled)<<i)
}

// putBuffer clears b and keeps it if its capacity is a pooled class.
func putBuffer(b []byte) {
	c := uint64(cap(b))
	if c < minPooled || c > maxPooled || c&(c-1) != 0 {
		return
	}
	clear(b[:len(b)]) // what lies beyond len was never handed out
	b = b[:0]
	pools[poolIndex(c)].Put(&b)
}
