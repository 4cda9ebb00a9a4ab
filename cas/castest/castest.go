package castest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/esf-dev/esf/cas"
	"github.com/zeebo/blake3"
)

// Corrupter damages a stored object in place so that its bytes no longer
// match its id (for example by flipping one byte). A test harness implements
// it, typically by embedding the store it returns.
type Corrupter interface {
	Corrupt(t testing.TB, id cas.ID)
}

// TempFiler lists the temporary files a store holds (Puts in progress or
// left behind), so the suite can check that failed Puts clean up.
type TempFiler interface {
	TempFiles(t testing.TB) []string
}

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore func(t *testing.T) cas.Store) {
	seed := uint64(0)
	if s := os.Getenv("ESF_CASTEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ESF_CASTEST_SEED=%q: %v", s, err)
		}
		seed = v
	} else {
		seed = rand.Uint64()
	}
	t.Logf("content seed %d (replay with ESF_CASTEST_SEED=%d)", seed, seed)
	s := &suite{newStore: newStore, seed: seed}
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"RoundTrip", s.testRoundTrip},
		{"IDIsBLAKE3", s.testIDIsBLAKE3},
		{"PutIdempotent", s.testPutIdempotent},
		{"PutReaderShapes", s.testPutReaderShapes},
		{"Missing", s.testMissing},
		{"Walk", s.testWalk},
		{"WalkStopsOnError", s.testWalkStopsOnError},
		{"Delete", s.testDelete},
		{"ConcurrentSamePut", s.testConcurrentSame},
		{"ConcurrentDifferentPut", s.testConcurrentDifferent},
		{"ConcurrentReaders", s.testConcurrentReaders},
		{"PutCancelledMidStream", s.testPutCancelled},
		{"PutReaderError", s.testPutReaderError},
		{"CancelledContext", s.testCancelledContext},
		{"CorruptionSurfaces", s.testCorruption},
	} {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	newStore func(t *testing.T) cas.Store
	seed     uint64
	mu       sync.Mutex
	n        uint64 // content streams handed out, so each is distinct
}

// content returns size pseudo-random bytes, distinct on every call.
func (s *suite) content(size int) []byte {
	s.mu.Lock()
	s.n++
	n := s.n
	s.mu.Unlock()
	b := make([]byte, size)
	r := rand.NewChaCha8(seed32(s.seed, n))
	r.Read(b)
	return b
}

func seed32(seed, n uint64) [32]byte {
	var k [32]byte
	for i := range 8 {
		k[i] = byte(seed >> (8 * i))
		k[8+i] = byte(n >> (8 * i))
	}
	return k
}

func put(t testing.TB, st cas.Store, b []byte) cas.Info {
	t.Helper()
	info, _, err := st.Put(context.Background(), bytes.NewReader(b))
	if err != nil {
		t.Fatalf("put %d bytes: %v", len(b), err)
	}
	return info
}

func get(t testing.TB, st cas.Store, id cas.ID) []byte {
	t.Helper()
	rc, err := st.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get %s: %v", id.Short(), err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", id.Short(), err)
	}
	return b
}

// list returns every object Walk reports, failing on duplicates.
func list(t testing.TB, st cas.Store) map[cas.ID]int64 {
	t.Helper()
	m := map[cas.ID]int64{}
	err := st.Walk(context.Background(), func(info cas.Info) error {
		if _, dup := m[info.ID]; dup {
			return fmt.Errorf("walk reported %s twice", info.ID.Short())
		}
		m[info.ID] = info.Size
		return nil
	})
	if err != nil {
		t.Fatalf("walk: %v", err)
	}
	return m
}

func noTempFiles(t testing.TB, st cas.Store) {
	t.Helper()
	if tf, ok := st.(TempFiler); ok {
		if left := tf.TempFiles(t); len(left) > 0 {
			t.Errorf("temp files left behind: %q", left)
		}
	}
}

// Sizes straddle the chunk sizes stores commonly use (4 KiB to 1 MiB), so
// both "whole object in one buffer" and streamed paths are taken.
var sizes = []int{0, 1, 4095, 4096, 64<<10 + 1, 256 << 10, 256<<10 + 1, 1<<20 + 3, 5<<20 + 7}

func (s *suite) testRoundTrip(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	for _, size := range sizes {
		b := s.content(size)
		// Odd-sized reads make chunk boundaries fall mid-buffer.
		r := &chunkReader{r: bytes.NewReader(b), max: 7777}
		info, created, err := st.Put(ctx, r)
		if err != nil {
			t.Fatalf("put %d bytes: %v", size, err)
		}
		if !created || info.Size != int64(size) || info.ID != cas.Sum(b) {
			t.Fatalf("put %d bytes = %+v created %v, want size %d id %s created", size, info, created, size, cas.Sum(b).Short())
		}
		if got := get(t, st, info.ID); !bytes.Equal(got, b) {
			t.Fatalf("get of %d-byte object returned %d different bytes", size, len(got))
		}
		if ok, err := st.Has(ctx, info.ID); !ok || err != nil {
			t.Fatalf("has %d-byte object = %v, %v", size, ok, err)
		}
		if si, err := st.Stat(ctx, info.ID); err != nil || si != info {
			t.Fatalf("stat %d-byte object = %+v, %v; want %+v", size, si, err, info)
		}
		got, err := cas.ReadAll(ctx, st, info.ID)
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("cas.ReadAll of %d-byte object: %v", size, err)
		}
	}
	if n := len(list(t, st)); n != len(sizes) {
		t.Fatalf("walk lists %d objects after %d puts", n, len(sizes))
	}
}

func (s *suite) testIDIsBLAKE3(t *testing.T) {
	st := s.newStore(t)
	// Pin the algorithm independently of cas.Sum: BLAKE3-256 of "abc".
	const abc = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
	info := put(t, st, []byte("abc"))
	if info.ID.String() != abc {
		t.Fatalf("id of %q = %s, want %s", "abc", info.ID, abc)
	}
	b := s.content(3 << 20)
	info = put(t, st, b)
	if want := blake3.Sum256(b); info.ID != cas.ID(want) {
		t.Fatalf("id of 3 MiB = %s, want blake3 %x", info.ID.Short(), want[:6])
	}
}

func (s *suite) testPutIdempotent(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	for _, size := range []int{0, 10, 300 << 10} {
		b := s.content(size)
		first, created, err := st.Put(ctx, bytes.NewReader(b))
		if err != nil || !created {
			t.Fatalf("first put of %d bytes: created %v, %v", size, created, err)
		}
		before := list(t, st)
		again, created, err := st.Put(ctx, bytes.NewReader(b))
		if err != nil || created || again != first {
			t.Fatalf("second put of %d bytes = %+v created %v, %v; want %+v, not created", size, again, created, err, first)
		}
		if after := list(t, st); len(after) != len(before) {
			t.Fatalf("second put changed the object count %d -> %d", len(before), len(after))
		}
		if got := get(t, st, first.ID); !bytes.Equal(got, b) {
			t.Fatalf("object changed after second put")
		}
		noTempFiles(t, st)
	}
}

// chunkReader returns at most max bytes per Read.
type chunkReader struct {
	r   io.Reader
	max int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.max {
		p = p[:c.max]
	}
	return c.r.Read(p)
}

// closeRecorder notes whether Put closed its reader, which it must not.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

func (s *suite) testPutReaderShapes(t *testing.T) {
	ctx := context.Background()
	b := s.content(700 << 10)
	shapes := []struct {
		name string
		r    func() io.Reader
	}{
		{"OneByte", func() io.Reader { return iotest.OneByteReader(bytes.NewReader(b[:5000])) }},
		{"Half", func() io.Reader { return iotest.HalfReader(bytes.NewReader(b)) }},
		// The last bytes arrive together with io.EOF.
		{"DataErr", func() io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) }},
		{"Multi", func() io.Reader {
			return io.MultiReader(bytes.NewReader(b[:1]), bytes.NewReader(nil), bytes.NewReader(b[1:]))
		}},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			st := s.newStore(t)
			want, err := io.ReadAll(sh.r())
			if err != nil {
				t.Fatal(err)
			}
			cr := &closeRecorder{Reader: sh.r()}
			info, created, err := st.Put(ctx, cr)
			if err != nil || !created || info.ID != cas.Sum(want) || info.Size != int64(len(want)) {
				t.Fatalf("put = %+v created %v, %v; want id %s size %d", info, created, err, cas.Sum(want).Short(), len(want))
			}
			if cr.closed {
				t.Fatalf("Put closed its reader")
			}
			if n, _ := cr.Read(make([]byte, 1)); n != 0 {
				t.Fatalf("Put did not read to EOF")
			}
			if !bytes.Equal(get(t, st, info.ID), want) {
				t.Fatalf("content differs")
			}
		})
	}
}

func (s *suite) testMissing(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	put(t, st, []byte("present"))
	for _, id := range []cas.ID{cas.Sum([]byte("absent")), cas.ZeroID} {
		if rc, err := st.Get(ctx, id); !errors.Is(err, cas.ErrNotFound) {
			if rc != nil {
				rc.Close()
			}
			t.Errorf("get missing %s: err = %v, want ErrNotFound", id.Short(), err)
		}
		if _, err := st.Stat(ctx, id); !errors.Is(err, cas.ErrNotFound) {
			t.Errorf("stat missing %s: err = %v, want ErrNotFound", id.Short(), err)
		}
		if ok, err := st.Has(ctx, id); ok || err != nil {
			t.Errorf("has missing %s = %v, %v; want false, nil", id.Short(), ok, err)
		}
		if _, err := cas.ReadAll(ctx, st, id); !errors.Is(err, cas.ErrNotFound) {
			t.Errorf("cas.ReadAll missing: err = %v, want ErrNotFound", err)
		}
	}
}

func (s *suite) testWalk(t *testing.T) {
	st := s.newStore(t)
	if got := list(t, st); len(got) != 0 {
		t.Fatalf("new store lists %d objects", len(got))
	}
	want := map[cas.ID]int64{}
	// Enough objects that many share a fan-out prefix in stores that have one.
	for i := range 300 {
		b := s.content(i % 50)
		info := put(t, st, b)
		want[info.ID] = info.Size
	}
	if got := list(t, st); !mapsEqual(got, want) {
		t.Fatalf("walk lists %d objects, want exactly the %d put (sizes included)", len(got), len(want))
	}
}

func mapsEqual(a, b map[cas.ID]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func (s *suite) testWalkStopsOnError(t *testing.T) {
	st := s.newStore(t)
	for range 10 {
		put(t, st, s.content(8))
	}
	stop := errors.New("stop")
	calls := 0
	err := st.Walk(context.Background(), func(cas.Info) error {
		calls++
		if calls == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 3 {
		t.Fatalf("walk with fn failing at call 3: err = %v after %d calls", err, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err = st.Walk(ctx, func(cas.Info) error {
		calls++
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("walk cancelled during call 1: err = %v after %d calls, want context.Canceled after 1", err, calls)
	}
}

func (s *suite) testDelete(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	keep := put(t, st, s.content(100))
	goneBytes := s.content(300 << 10)
	gone := put(t, st, goneBytes)
	if err := st.Delete(ctx, gone.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if ok, err := st.Has(ctx, gone.ID); ok || err != nil {
		t.Fatalf("has after delete = %v, %v", ok, err)
	}
	if _, err := st.Get(ctx, gone.ID); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("get after delete: err = %v, want ErrNotFound", err)
	}
	if got := list(t, st); len(got) != 1 || got[keep.ID] != keep.Size {
		t.Fatalf("walk after delete lists %d objects, want only the kept one", len(got))
	}
	// Idempotent: deleting again, or what never existed, is success.
	for _, id := range []cas.ID{gone.ID, cas.Sum([]byte("never"))} {
		if err := st.Delete(ctx, id); err != nil {
			t.Fatalf("delete missing %s: %v", id.Short(), err)
		}
	}
	// And the object can come back.
	info, created, err := st.Put(ctx, bytes.NewReader(goneBytes))
	if err != nil || !created || info != gone {
		t.Fatalf("put after delete = %+v created %v, %v; want %+v created", info, created, err, gone)
	}
	if !bytes.Equal(get(t, st, gone.ID), goneBytes) {
		t.Fatalf("object put after delete differs")
	}
}

// putAll runs fn(i) for i in [0,n) on n goroutines, all released at once.
func putAll(n int, fn func(i int)) {
	var start, wg sync.WaitGroup
	start.Add(1)
	for i := range n {
		wg.Go(func() {
			start.Wait()
			fn(i)
		})
	}
	start.Done()
	wg.Wait()
}

func (s *suite) testConcurrentSame(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{100, 600 << 10} {
		st := s.newStore(t)
		b := s.content(size)
		const n = 16
		infos := make([]cas.Info, n)
		created := make([]bool, n)
		errs := make([]error, n)
		putAll(n, func(i int) {
			infos[i], created[i], errs[i] = st.Put(ctx, bytes.NewReader(b))
		})
		nCreated := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("concurrent put %d of %d bytes: %v", i, size, errs[i])
			}
			if infos[i].ID != cas.Sum(b) || infos[i].Size != int64(size) {
				t.Fatalf("concurrent put %d returned %+v", i, infos[i])
			}
			if created[i] {
				nCreated++
			}
		}
		// The contract does not promise exactly one winner; the stores
		// that can promise it check that in their own tests.
		if nCreated == 0 {
			t.Fatalf("%d concurrent puts of a new object: none reported created", n)
		}
		if got := list(t, st); len(got) != 1 {
			t.Fatalf("after concurrent puts of one object, walk lists %d", len(got))
		}
		if !bytes.Equal(get(t, st, cas.Sum(b)), b) {
			t.Fatalf("content differs after concurrent puts")
		}
		noTempFiles(t, st)
	}
}

func (s *suite) testConcurrentDifferent(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	const n = 24
	blobs := make([][]byte, n)
	for i := range blobs {
		blobs[i] = s.content(i * 23 << 10) // 0 .. ~530 KiB
	}
	errs := make([]error, n)
	putAll(n, func(i int) {
		var created bool
		_, created, errs[i] = st.Put(ctx, bytes.NewReader(blobs[i]))
		if errs[i] == nil && !created {
			errs[i] = errors.New("a new object was not reported created")
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	got := list(t, st)
	if len(got) != n {
		t.Fatalf("walk lists %d objects after %d distinct concurrent puts", len(got), n)
	}
	for _, b := range blobs {
		if !bytes.Equal(get(t, st, cas.Sum(b)), b) {
			t.Fatalf("object of %d bytes differs", len(b))
		}
	}
	noTempFiles(t, st)
}

func (s *suite) testConcurrentReaders(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	b := s.content(1 << 20)
	info := put(t, st, b)
	errs := make([]error, 8)
	putAll(len(errs), func(i int) {
		if i%2 == 1 {
			// Writers of other objects alongside.
			_, _, errs[i] = st.Put(ctx, bytes.NewReader(b[:i*1000]))
			return
		}
		rc, err := st.Get(ctx, info.ID)
		if err != nil {
			errs[i] = err
			return
		}
		defer rc.Close()
		got, err := io.ReadAll(rc)
		if err == nil && !bytes.Equal(got, b) {
			err = errors.New("content differs")
		}
		errs[i] = err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("goroutine %d: %v", i, err)
		}
	}
	// A reader closed before EOF is fine and leaves the object intact.
	rc, err := st.Get(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rc, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if err := rc.Close(); err != nil {
		t.Fatalf("close of a half-read object: %v", err)
	}
}

// cancelReader serves r and calls cancel once it has served after bytes,
// then keeps serving: the store must notice the context, not an EOF.
type cancelReader struct {
	r      io.Reader
	after  int
	served int
	cancel func()
}

func (c *cancelReader) Read(p []byte) (int, error) {
	if c.served >= c.after {
		c.cancel()
	}
	n, err := c.r.Read(p)
	c.served += n
	return n, err
}

func (s *suite) testPutCancelled(t *testing.T) {
	for _, after := range []int{0, 100, 1 << 20} {
		t.Run(strconv.Itoa(after), func(t *testing.T) {
			st := s.newStore(t)
			b := s.content(8 << 20)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cr := &cancelReader{r: bytes.NewReader(b), after: after, cancel: cancel}
			_, _, err := st.Put(ctx, cr)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("put cancelled after %d bytes: err = %v, want context.Canceled", after, err)
			}
			if cr.served >= len(b) {
				t.Fatalf("put read all %d bytes despite cancellation after %d", cr.served, after)
			}
			s.assertNothingStored(t, st, b)
		})
	}
}

func (s *suite) assertNothingStored(t *testing.T, st cas.Store, b []byte) {
	t.Helper()
	if ok, err := st.Has(context.Background(), cas.Sum(b)); ok || err != nil {
		t.Fatalf("failed put left the object: has = %v, %v", ok, err)
	}
	if got := list(t, st); len(got) != 0 {
		t.Fatalf("failed put left %d objects", len(got))
	}
	noTempFiles(t, st)
}

// errReader serves r then fails with err instead of EOF.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		err = e.err
	}
	return n, err
}

func (s *suite) testPutReaderError(t *testing.T) {
	boom := errors.New("boom")
	for _, size := range []int{0, 10, 3 << 20} {
		st := s.newStore(t)
		b := s.content(size)
		_, _, err := st.Put(context.Background(), &errReader{r: bytes.NewReader(b), err: boom})
		if !errors.Is(err, boom) {
			t.Fatalf("put from a reader failing after %d bytes: err = %v, want the reader's", size, err)
		}
		s.assertNothingStored(t, st, b)
	}
}

func (s *suite) testCancelledContext(t *testing.T) {
	st := s.newStore(t)
	info := put(t, st, []byte("x"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := st.Put(ctx, bytes.NewReader([]byte("y"))); !errors.Is(err, context.Canceled) {
		t.Errorf("put with cancelled context: err = %v", err)
	}
	if got := list(t, st); len(got) != 1 {
		t.Errorf("put with cancelled context stored something: %d objects", len(got))
	}
	if err := st.Walk(ctx, func(cas.Info) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("walk with cancelled context: err = %v", err)
	}
	if rc, err := st.Get(ctx, info.ID); !errors.Is(err, context.Canceled) {
		if rc != nil {
			rc.Close()
		}
		t.Errorf("get with cancelled context: err = %v", err)
	}
	if err := st.Delete(ctx, info.ID); !errors.Is(err, context.Canceled) {
		t.Errorf("delete with cancelled context: err = %v", err)
	}
	if ok, _ := st.Has(context.Background(), info.ID); !ok {
		t.Errorf("delete with cancelled context deleted the object")
	}
	noTempFiles(t, st)
}

func (s *suite) testCorruption(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{1, 10, 4096, 300 << 10, 2<<20 + 1} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			st := s.newStore(t)
			c, ok := st.(Corrupter)
			if !ok {
				t.Skipf("%T does not implement castest.Corrupter", st)
			}
			b := s.content(size)
			info := put(t, st, b)
			c.Corrupt(t, info.ID)

			// Whole reads end in ErrCorrupt.
			rc, err := st.Get(ctx, info.ID)
			if err != nil {
				t.Fatalf("get of corrupted object: %v (want the error at the end of the read)", err)
			}
			_, err = io.ReadAll(rc)
			rc.Close()
			if !errors.Is(err, cas.ErrCorrupt) {
				t.Fatalf("read of corrupted %d-byte object: err = %v, want ErrCorrupt", size, err)
			}
			// Small reads never see a clean io.EOF, even after the error.
			rc, err = st.Get(ctx, info.ID)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 1000)
			var last error
			total := 0
			for range 1 << 20 {
				n, err := rc.Read(buf)
				total += n
				if err == io.EOF {
					t.Fatalf("corrupted object read to a clean io.EOF after %d bytes", total)
				}
				if err != nil {
					if last != nil {
						break // the error is sticky: read once more and stop
					}
					last = err
				}
			}
			rc.Close()
			if !errors.Is(last, cas.ErrCorrupt) {
				t.Fatalf("small reads of corrupted object ended with %v, want ErrCorrupt", last)
			}
			if _, err := cas.ReadAll(ctx, st, info.ID); !errors.Is(err, cas.ErrCorrupt) {
				t.Fatalf("cas.ReadAll of corrupted object: err = %v", err)
			}
			// Has does not verify; Delete then Put repairs.
			if ok, err := st.Has(ctx, info.ID); !ok || err != nil {
				t.Fatalf("has of corrupted object = %v, %v; want true (Has does not verify)", ok, err)
			}
			if err := st.Delete(ctx, info.ID); err != nil {
				t.Fatal(err)
			}
			if _, created, err := st.Put(ctx, bytes.NewReader(b)); err != nil || !created {
				t.Fatalf("re-put after deleting the corrupted copy: created %v, %v", created, err)
			}
			if !bytes.Equal(get(t, st, info.ID), b) {
				t.Fatalf("repaired object differs")
			}
		})
	}
}
