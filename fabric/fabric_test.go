package fabric

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/errdefs"
)

var seedFlag = flag.Uint64("seed", 0, "seed of the randomized tally test (0: time-based)")

func openTest(t *testing.T, dir string) *Fabric {
	t.Helper()
	f, err := Open(context.Background(), testOptions(t, Options{StateDir: dir}))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestOptionsValidate(t *testing.T) {
	_, err := Open(context.Background(), Options{})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Open without a state dir: %v, want invalid argument", err)
	}
}

func TestOpenLayoutAndLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	f := openTest(t, dir)
	for _, p := range []string{"lock", "cas/objects", "tmp"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("layout: %v", err)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode %o, want 700", fi.Mode().Perm())
	}

	if _, err := Open(context.Background(), Options{StateDir: dir}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("second Open of a held state dir: %v, want failed precondition", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	f2 := openTest(t, dir) // the lock is released by Close
	f2.Close()
}

func TestOpenEmptiesTmp(t *testing.T) {
	dir := t.TempDir()
	leftover := filepath.Join(dir, "tmp", "import-123", "x")
	if err := os.MkdirAll(filepath.Dir(leftover), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(leftover, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	openTest(t, dir)
	if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leftover in tmp after Open: %v", err)
	}
}

// putBlobs stores n distinct blobs of distinct sizes and returns their ids
// and total size.
func putBlobs(t *testing.T, s cas.Putter, prefix string, n int) ([]cas.ID, int64) {
	t.Helper()
	var ids []cas.ID
	var total int64
	for i := range n {
		b := bytes.Repeat([]byte(fmt.Sprintf("%s-%d;", prefix, i)), i+1)
		info, _, err := s.Put(context.Background(), bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
		total += info.Size
	}
	return ids, total
}

func TestStatusCountsExistingAndNewObjects(t *testing.T) {
	dir := t.TempDir()
	// Objects stored before the daemon starts are found by the initial walk.
	pre, err := local.Open(filepath.Join(dir, "cas"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, size := putBlobs(t, pre, "pre", 50)

	f := openTest(t, dir)
	ctx := context.Background()
	st, err := f.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Objects != 50 || st.Bytes != size || st.StateDir != dir || st.Version != Version {
		t.Fatalf("status %+v, want 50 objects, %d bytes, state %s", st, size, dir)
	}

	// Puts through the fabric count once, whether new or not.
	_, more := putBlobs(t, f.Store(), "post", 10)
	putBlobs(t, f.Store(), "post", 10)
	// Deletes subtract once, even when repeated.
	for _, id := range ids[:5] {
		for range 2 {
			if err := f.Store().Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	var deleted int64 // the sizes putBlobs gave ids[:5]
	for i := range 5 {
		deleted += int64(len(fmt.Sprintf("pre-%d;", i)) * (i + 1))
	}
	st, err = f.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := Status{Version: Version, StateDir: dir, Objects: 55, Bytes: size + more - deleted}
	if st != want {
		t.Fatalf("status %+v, want %+v", st, want)
	}
	if n, b := walkCount(t, f.Store()); n != st.Objects || b != st.Bytes {
		t.Fatalf("tally %d objects %d bytes, walk finds %d, %d", st.Objects, st.Bytes, n, b)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func walkCount(t *testing.T, s cas.Walker) (n, b int64) {
	t.Helper()
	err := s.Walk(context.Background(), func(i cas.Info) error {
		n++
		b += i.Size
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n, b
}

// slowWalker interleaves its Walk with other goroutines so that mutations
// land between the objects it reports.
type slowWalker struct{ cas.Store }

func (s slowWalker) Walk(ctx context.Context, fn func(cas.Info) error) error {
	return s.Store.Walk(ctx, func(i cas.Info) error {
		runtime.Gosched()
		time.Sleep(10 * time.Microsecond)
		return fn(i)
	})
}

// TestTallyExactUnderConcurrentMutation races Puts and Deletes of the same
// ids against the initial walk: whatever the interleaving, the tally must
// equal what the store holds once the walk is over.
func TestTallyExactUnderConcurrentMutation(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -seed %d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	for round := range 5 {
		m := mem.New()
		ids, _ := putBlobs(t, m, "base", 200)
		c := newCountingStore(slowWalker{m})
		ctx := context.Background()

		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.scan(ctx, discardLogger())
		}()
		workers := 4
		seeds := make([]uint64, workers)
		for i := range seeds {
			seeds[i] = rng.Uint64()
		}
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(seeds[w], uint64(round)))
				for range 150 {
					switch r.IntN(3) {
					case 0: // delete a base object (maybe twice, maybe concurrently)
						if err := c.Delete(ctx, ids[r.IntN(len(ids))]); err != nil {
							t.Error(err)
						}
					case 1: // re-put a base object
						i := r.IntN(len(ids))
						b := bytes.Repeat([]byte(fmt.Sprintf("base-%d;", i)), i+1)
						if _, _, err := c.Put(ctx, bytes.NewReader(b)); err != nil {
							t.Error(err)
						}
					case 2: // a new object
						b := []byte(fmt.Sprintf("new-%d-%d", w, r.IntN(50)))
						if _, _, err := c.Put(ctx, bytes.NewReader(b)); err != nil {
							t.Error(err)
						}
					}
				}
			}()
		}
		wg.Wait()
		objects, bytes, err := c.tally(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n, b := walkCount(t, m)
		if objects != n || bytes != b {
			t.Fatalf("round %d (seed %d): tally %d objects %d bytes, store holds %d, %d", round, seed, objects, bytes, n, b)
		}
	}
}

func TestResolveRoot(t *testing.T) {
	f := openTest(t, t.TempDir())
	ctx := context.Background()
	info, _, err := f.Store().Put(ctx, bytes.NewReader([]byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		in   string
		want error
	}{
		{"", errdefs.ErrInvalidArgument},
		{"xyz", errdefs.ErrInvalidArgument},
		{info.ID.String()[:63] + "g", errdefs.ErrInvalidArgument},
		{cas.Sum([]byte("absent")).String(), errdefs.ErrNotFound},
		{info.ID.String(), nil},
		{" " + info.ID.String() + "\n", nil},
	}
	for _, tt := range tests {
		id, err := f.resolveRoot(ctx, tt.in)
		if tt.want == nil {
			if err != nil || id != info.ID {
				t.Errorf("resolveRoot(%q) = %s, %v; want %s", tt.in, id, err, info.ID)
			}
			continue
		}
		if !errors.Is(err, tt.want) {
			t.Errorf("resolveRoot(%q) error %v, want %v", tt.in, err, tt.want)
		}
	}
}

func TestCallInfoContext(t *testing.T) {
	ctx := context.Background()
	if _, ok := CallInfoFrom(ctx); ok {
		t.Fatal("CallInfo in a bare context")
	}
	ci := CallInfo{IdempotencyKey: "k", TraceID: "t", SpanID: "s"}
	got, ok := CallInfoFrom(WithCallInfo(ctx, ci))
	if !ok || got != ci {
		t.Fatalf("CallInfoFrom = %+v, %v; want %+v", got, ok, ci)
	}
}

func TestCloseStopsTallyWalk(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(context.Background(), Options{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- f.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := f.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
}

func TestTallyCountsBatchesOnCommit(t *testing.T) {
	f := openTest(t, t.TempDir())
	ctx := context.Background()
	tally := func() int64 {
		t.Helper()
		st, err := f.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Objects
	}
	putBlobs(t, f.Store(), "old", 2)
	if _, ok := f.Store().(cas.Batcher); !ok {
		t.Fatal("the fabric's store hides the local store's batches")
	}

	b := cas.NewBatch(f.Store())
	putBlobs(t, b, "old", 2) // already stored: not created
	putBlobs(t, b, "new", 3)
	if n := tally(); n != 2 {
		t.Fatalf("tally %d before commit, want 2", n)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.Abort() // no-op after Commit
	if n := tally(); n != 5 {
		t.Fatalf("tally %d after commit, want 5", n)
	}

	b = cas.NewBatch(f.Store())
	putBlobs(t, b, "aborted", 4)
	b.Abort()
	if n, _ := walkCount(t, f.Store()); n != tally() || n != 5 {
		t.Fatalf("after an aborted batch: tally %d, store %d, want 5", tally(), n)
	}
}
