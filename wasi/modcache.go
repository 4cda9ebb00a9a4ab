package wasi

import (
	"container/list"
	"context"
	"sync"

	"github.com/tetratelabs/wazero"

	"github.com/esf-dev/esf/cas"
)

// modules keeps compiled modules in memory by module id, at most max of
// them that no run is using. wazero's compilation cache (memory and disk)
// still saves the machine code, but a CompileModule through it decodes and
// validates the binary again, which for a Go module costs tens of
// milliseconds; this map is what makes a warm run cheap.
//
// An entry is compiled once however many runs ask for it at the same
// time (wazero recommends that: its cache does not hold a lock while it
// compiles). It is closed only when evicted and unused.
type modules struct {
	compile func(context.Context, []byte) (wazero.CompiledModule, error)
	max     int

	mu   sync.Mutex
	byID map[cas.ID]*module
	lru  list.List // of *module with refs == 0, least recent at the front
}

type module struct {
	id    cas.ID
	ready chan struct{} // closed when compiled or err is set
	cm    wazero.CompiledModule
	err   error
	refs  int
	elem  *list.Element // in lru while refs == 0
}

func newModules(compile func(context.Context, []byte) (wazero.CompiledModule, error), max int) *modules {
	return &modules{compile: compile, max: max, byID: map[cas.ID]*module{}}
}

// acquire returns the compiled module for bin (whose id is id), compiling
// it if needed; compiled reports whether this call did. The caller
// releases it. A compile runs on the caller's goroutine and wazero cannot
// interrupt it; callers that wait for another's compile honour ctx.
func (c *modules) acquire(ctx context.Context, id cas.ID, bin []byte) (m *module, compiled bool, err error) {
	c.mu.Lock()
	m, ok := c.byID[id]
	if ok {
		c.ref(m)
		c.mu.Unlock()
		select {
		case <-m.ready:
		case <-ctx.Done():
			c.release(m)
			return nil, false, ctx.Err()
		}
		if m.err != nil {
			c.release(m)
			return nil, false, m.err
		}
		return m, false, nil
	}
	m = &module{id: id, ready: make(chan struct{}), refs: 1}
	c.byID[id] = m
	c.mu.Unlock()

	m.cm, m.err = c.compile(ctx, bin)
	if m.err != nil {
		// Forget failures: a later call may pass a different context, and
		// a bad binary is cheap to reject again.
		c.mu.Lock()
		delete(c.byID, id)
		c.mu.Unlock()
		close(m.ready)
		c.release(m)
		return nil, false, m.err
	}
	close(m.ready)
	return m, true, nil
}

func (c *modules) ref(m *module) {
	m.refs++
	if m.elem != nil {
		c.lru.Remove(m.elem)
		m.elem = nil
	}
}

// release drops a reference; an unused module joins the LRU list and the
// oldest unused ones beyond max are closed.
func (c *modules) release(m *module) {
	c.mu.Lock()
	m.refs--
	var evict []*module
	if m.refs == 0 {
		if m.err != nil || c.byID[m.id] != m {
			// Failed or already dropped: nothing to keep.
		} else {
			m.elem = c.lru.PushBack(m)
			for c.lru.Len() > c.max {
				old := c.lru.Remove(c.lru.Front()).(*module)
				old.elem = nil
				delete(c.byID, old.id)
				evict = append(evict, old)
			}
		}
	}
	c.mu.Unlock()
	for _, old := range evict {
		_ = old.cm.Close(context.Background())
	}
}

// len reports how many modules are held, for tests.
func (c *modules) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID)
}

// closeAll closes every module; no run may be in flight.
func (c *modules) closeAll(ctx context.Context) {
	c.mu.Lock()
	all := c.byID
	c.byID = map[cas.ID]*module{}
	c.lru.Init()
	c.mu.Unlock()
	for _, m := range all {
		if m.cm != nil {
			_ = m.cm.Close(ctx)
		}
	}
}
