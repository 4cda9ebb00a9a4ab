package wasi

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/esf-dev/esf/cas"
)

// fakeCompiled stands in for a compiled module; only Close is called.
type fakeCompiled struct {
	wazero.CompiledModule
	closed atomic.Bool
}

func (f *fakeCompiled) Close(context.Context) error {
	f.closed.Store(true)
	return nil
}

type fakeCompiler struct {
	mu    sync.Mutex
	calls map[string]int
	made  map[string]*fakeCompiled
	gate  chan struct{} // when set, compiles wait for it
	fail  bool
}

func (c *fakeCompiler) compile(ctx context.Context, bin []byte) (wazero.CompiledModule, error) {
	if c.gate != nil {
		<-c.gate
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[string(bin)]++
	if c.fail {
		return nil, errors.New("bad module")
	}
	f := &fakeCompiled{}
	c.made[string(bin)] = f
	return f, nil
}

func newFake() *fakeCompiler {
	return &fakeCompiler{calls: map[string]int{}, made: map[string]*fakeCompiled{}}
}

func acquire(t *testing.T, c *modules, name string) *module {
	t.Helper()
	m, _, err := c.acquire(context.Background(), cas.Sum([]byte(name)), []byte(name))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestModules_EvictsOnlyUnused(t *testing.T) {
	f := newFake()
	c := newModules(f.compile, 1)
	a := acquire(t, c, "a")
	b := acquire(t, c, "b")
	c.release(b) // b unused, within the bound
	if c.len() != 2 || f.made["b"].closed.Load() {
		t.Fatalf("len %d, b closed %v", c.len(), f.made["b"].closed.Load())
	}
	c.release(a) // two unused, bound 1: the older (b) goes
	if !f.made["b"].closed.Load() || f.made["a"].closed.Load() || c.len() != 1 {
		t.Fatalf("b closed %v, a closed %v, len %d", f.made["b"].closed.Load(), f.made["a"].closed.Load(), c.len())
	}
	acquire(t, c, "a")
	if f.calls["a"] != 1 {
		t.Errorf("a compiled %d times", f.calls["a"])
	}
	acquire(t, c, "b")
	if f.calls["b"] != 2 {
		t.Errorf("evicted b compiled %d times, want 2", f.calls["b"])
	}
	c.closeAll(context.Background())
	if !f.made["a"].closed.Load() {
		t.Error("closeAll left a open")
	}
}

// TestModules_CompilesOnceForConcurrentCallers: five callers of one module
// while it compiles (synctest.Wait: all of them are inside acquire, one
// compiling, four waiting) compile it once.
func TestModules_CompilesOnceForConcurrentCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		f.gate = make(chan struct{})
		c := newModules(f.compile, 4)
		var wg sync.WaitGroup
		var compiled atomic.Int32
		for range 5 {
			wg.Go(func() {
				m, did, err := c.acquire(context.Background(), cas.Sum([]byte("x")), []byte("x"))
				if err != nil {
					t.Error(err)
					return
				}
				if did {
					compiled.Add(1)
				}
				c.release(m)
			})
		}
		synctest.Wait()
		c.mu.Lock()
		refs := -1
		if m := c.byID[cas.Sum([]byte("x"))]; m != nil {
			refs = m.refs
		}
		c.mu.Unlock()
		if refs != 5 {
			t.Fatalf("while compiling: %d callers hold the module, want 5", refs)
		}
		close(f.gate)
		wg.Wait()
		if f.calls["x"] != 1 || compiled.Load() != 1 {
			t.Errorf("compiled %d times, %d callers say they did", f.calls["x"], compiled.Load())
		}
	})
}

// TestModules_WaiterHonoursContext: a caller waiting for another's compile
// gives up when its context ends (on synctest's clock: no real wait).
func TestModules_WaiterHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		f.gate = make(chan struct{})
		c := newModules(f.compile, 4)
		id := cas.Sum([]byte("x"))
		done := make(chan struct{})
		go func() {
			defer close(done)
			if m, _, err := c.acquire(context.Background(), id, []byte("x")); err == nil {
				c.release(m)
			}
		}()
		synctest.Wait() // the first caller is compiling
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		if _, _, err := c.acquire(ctx, id, []byte("x")); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("waiter: %v", err)
		}
		if waited := time.Since(start); waited != 20*time.Second {
			t.Errorf("waiter gave up after %v, want its 20s deadline", waited)
		}
		close(f.gate)
		<-done
	})
}

func TestModules_ForgetsFailures(t *testing.T) {
	f := newFake()
	f.fail = true
	c := newModules(f.compile, 4)
	for range 2 {
		if _, _, err := c.acquire(context.Background(), cas.Sum([]byte("bad")), []byte("bad")); err == nil {
			t.Fatal("no error")
		}
	}
	if f.calls["bad"] != 2 || c.len() != 0 {
		t.Errorf("calls %d, held %d", f.calls["bad"], c.len())
	}
}

func TestLimiter(t *testing.T) {
	l := &limiter{limit: 4 * pageSize}
	m := l.Allocate(pageSize, 100*pageSize)
	if b := m.Reallocate(pageSize); len(b) != pageSize {
		t.Fatalf("first allocation %d bytes", len(b))
	}
	b := m.Reallocate(3 * pageSize)
	b[3*pageSize-1] = 7
	if b = m.Reallocate(4 * pageSize); len(b) != 4*pageSize || b[3*pageSize-1] != 7 {
		t.Fatal("growth lost content")
	}
	if m.Reallocate(5*pageSize) != nil || l.denied.Load() != 5*pageSize {
		t.Fatalf("growth past the limit allowed, denied %d", l.denied.Load())
	}
	if l.peak.Load() != 4*pageSize {
		t.Errorf("peak %d", l.peak.Load())
	}
	m.Free()
}

// TestLimiter_RecyclesZeroed: buffers handed back after a run (the
// outgrown one and the last) reach later runs cleared, and only once the
// module has freed them.
func TestLimiter_RecyclesZeroed(t *testing.T) {
	dirty := bytes.Repeat([]byte{0xa5}, 12<<20)
	for range 2 {
		l := &limiter{limit: 64 << 20}
		m := l.Allocate(pageSize, 64<<20)
		copy(m.Reallocate(8<<20), dirty)
		copy(m.Reallocate(12<<20), dirty) // outgrows its class: the old buffer retires
		m.Free()
		l.recycle()

		for _, size := range []uint64{8 << 20, 12 << 20} {
			b := (&limiter{limit: 64 << 20}).Allocate(pageSize, 64<<20).Reallocate(size)
			if !bytes.Equal(b, make([]byte, size)) {
				t.Fatalf("a %d-byte buffer came back dirty", size)
			}
		}
	}
	// Not freed (the module is still open): nothing is recycled.
	l := &limiter{limit: 64 << 20}
	m := l.Allocate(pageSize, 64<<20)
	b := m.Reallocate(8 << 20)
	copy(b, dirty)
	l.recycle()
	if b[0] != 0xa5 {
		t.Fatal("recycle cleared a buffer its module had not freed")
	}
}
