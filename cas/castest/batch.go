package castest

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/esf-dev/esf/cas"
)

// RunBatch runs the conformance suite of the optional cas.Batcher role
// against stores made by newStore, which must implement it (an
// implementation calls RunBatch because it claims the role, so a store
// without it fails rather than skips). It checks the contract of cas.Batch:
// nothing visible before Commit, everything after; Abort and failed Commits
// leave nothing (objects or temp files); created is true once per new id;
// concurrent Puts into one batch; cancellation; interplay with plain Puts.
func RunBatch(t *testing.T, newStore func(t *testing.T) cas.Store) {
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
		{"InvisibleUntilCommit", s.testBatchInvisibleUntilCommit},
		{"Abort", s.testBatchAbort},
		{"DedupeInBatch", s.testBatchDedupe},
		{"SomeAlreadyStored", s.testBatchSomeStored},
		{"ConcurrentPut", s.testBatchConcurrentPut},
		{"PutFailures", s.testBatchPutFailures},
		{"CommitCancelled", s.testBatchCommitCancelled},
		{"EmptyCommit", s.testBatchEmptyCommit},
		{"RaceWithPlainPut", s.testBatchRaceWithPut},
		{"OverlappingBatches", s.testBatchOverlapping},
	} {
		t.Run(tc.name, tc.fn)
	}
}

func newBatch(t testing.TB, st cas.Store) cas.Batch {
	t.Helper()
	br, ok := st.(cas.Batcher)
	if !ok {
		t.Fatalf("%T does not implement cas.Batcher", st)
	}
	return br.NewBatch()
}

// batchPut puts b into the batch and checks the returned info.
func batchPut(t testing.TB, bt cas.Batch, b []byte) (cas.Info, bool) {
	t.Helper()
	info, created, err := bt.Put(context.Background(), bytes.NewReader(b))
	if err != nil {
		t.Fatalf("batch put %d bytes: %v", len(b), err)
	}
	if info.ID != cas.Sum(b) || info.Size != int64(len(b)) {
		t.Fatalf("batch put %d bytes = %+v, want id %s", len(b), info, cas.Sum(b).Short())
	}
	return info, created
}

// assertAbsent checks through every read role that id is not stored.
func assertAbsent(t testing.TB, st cas.Store, id cas.ID, what string) {
	t.Helper()
	ctx := context.Background()
	if ok, err := st.Has(ctx, id); ok || err != nil {
		t.Fatalf("%s: has %s = %v, %v; want false", what, id.Short(), ok, err)
	}
	if _, err := st.Stat(ctx, id); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("%s: stat %s: err = %v, want ErrNotFound", what, id.Short(), err)
	}
	if rc, err := st.Get(ctx, id); !errors.Is(err, cas.ErrNotFound) {
		if rc != nil {
			rc.Close()
		}
		t.Fatalf("%s: get %s: err = %v, want ErrNotFound", what, id.Short(), err)
	}
}

func (s *suite) testBatchInvisibleUntilCommit(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	bt := newBatch(t, st)
	defer bt.Abort()
	var blobs [][]byte
	for _, size := range sizes {
		blobs = append(blobs, s.content(size))
	}
	// Enough small objects to spread over many fan-out directories.
	for i := range 300 {
		blobs = append(blobs, s.content(8+i%100))
	}
	want := map[cas.ID]int64{}
	for _, b := range blobs {
		info, created := batchPut(t, bt, b)
		if !created {
			t.Fatalf("batch put of a new %d-byte object: created false", len(b))
		}
		want[info.ID] = info.Size
	}
	for _, b := range blobs {
		assertAbsent(t, st, cas.Sum(b), "before commit")
	}
	if got := list(t, st); len(got) != 0 {
		t.Fatalf("before commit, walk lists %d objects", len(got))
	}
	if err := bt.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if got := list(t, st); !mapsEqual(got, want) {
		t.Fatalf("after commit, walk lists %d objects, want exactly the %d put", len(got), len(want))
	}
	for _, b := range blobs {
		if got := get(t, st, cas.Sum(b)); !bytes.Equal(got, b) {
			t.Fatalf("committed %d-byte object reads back %d different bytes", len(b), len(got))
		}
		if si, err := st.Stat(ctx, cas.Sum(b)); err != nil || si.Size != int64(len(b)) {
			t.Fatalf("stat committed object = %+v, %v", si, err)
		}
	}
	noTempFiles(t, st)
	// The deferred Abort of the idiom must not undo the commit.
	bt.Abort()
	if got := list(t, st); len(got) != len(want) {
		t.Fatalf("abort after commit changed the store: %d objects, want %d", len(got), len(want))
	}
	// The store knows them now: a plain Put is no longer new.
	if _, created, err := st.Put(ctx, bytes.NewReader(blobs[len(blobs)-1])); err != nil || created {
		t.Fatalf("plain put of a committed object: created %v, %v", created, err)
	}
}

func (s *suite) testBatchAbort(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	keep := put(t, st, s.content(10))
	bt := newBatch(t, st)
	var blobs [][]byte
	for _, size := range []int{0, 1, 4096, 256<<10 + 1, 2 << 20} {
		b := s.content(size)
		blobs = append(blobs, b)
		batchPut(t, bt, b)
	}
	bt.Abort()
	for _, b := range blobs {
		assertAbsent(t, st, cas.Sum(b), "after abort")
	}
	if got := list(t, st); len(got) != 1 || got[keep.ID] != keep.Size {
		t.Fatalf("after abort, walk lists %d objects, want only the one stored before", len(got))
	}
	noTempFiles(t, st)
	bt.Abort() // no-op
	if _, _, err := bt.Put(ctx, bytes.NewReader(blobs[0])); !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("put after abort: err = %v, want ErrFailedPrecondition", err)
	}
	if err := bt.Commit(ctx); !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("commit after abort: err = %v, want ErrFailedPrecondition", err)
	}
	if got := list(t, st); len(got) != 1 {
		t.Fatalf("put/commit after abort stored something: %d objects", len(got))
	}
	// Nothing of the aborted batch lingers to make a later Put "not new".
	for _, b := range blobs {
		if _, created, err := st.Put(ctx, bytes.NewReader(b)); err != nil || !created {
			t.Fatalf("plain put after abort of %d bytes: created %v, %v", len(b), created, err)
		}
	}
	noTempFiles(t, st)
}

func (s *suite) testBatchDedupe(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	bt := newBatch(t, st)
	defer bt.Abort()
	want := map[cas.ID]int64{}
	for _, size := range []int{0, 10, 300 << 10} {
		b := s.content(size)
		for i := range 3 {
			info, created := batchPut(t, bt, b)
			if created != (i == 0) {
				t.Fatalf("put %d of the same %d bytes in one batch: created %v", i+1, size, created)
			}
			want[info.ID] = info.Size
		}
	}
	noTempFilesBeyond(t, st, len(want))
	if err := bt.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := list(t, st); !mapsEqual(got, want) {
		t.Fatalf("after commit walk lists %d objects, want %d", len(got), len(want))
	}
	noTempFiles(t, st)
}

// noTempFilesBeyond checks that an open batch holds at most n temp files:
// duplicates must not keep one each.
func noTempFilesBeyond(t testing.TB, st cas.Store, n int) {
	t.Helper()
	if tf, ok := st.(TempFiler); ok {
		if left := tf.TempFiles(t); len(left) > n {
			t.Errorf("open batch of %d distinct objects holds %d temp files", n, len(left))
		}
	}
}

func (s *suite) testBatchSomeStored(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	var old, fresh [][]byte
	for _, size := range []int{0, 7, 4096, 300 << 10} {
		b := s.content(size)
		put(t, st, b)
		old = append(old, b)
		fresh = append(fresh, s.content(size+1))
	}
	bt := newBatch(t, st)
	defer bt.Abort()
	for i := range old {
		if _, created := batchPut(t, bt, old[i]); created {
			t.Fatalf("batch put of an already stored %d-byte object: created true", len(old[i]))
		}
		if _, created := batchPut(t, bt, fresh[i]); !created {
			t.Fatalf("batch put of a new %d-byte object: created false", len(fresh[i]))
		}
	}
	noTempFilesBeyond(t, st, len(fresh))
	if got := list(t, st); len(got) != len(old) {
		t.Fatalf("before commit walk lists %d objects, want the %d stored before", len(got), len(old))
	}
	if err := bt.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := list(t, st); len(got) != len(old)+len(fresh) {
		t.Fatalf("after commit walk lists %d objects, want %d", len(got), len(old)+len(fresh))
	}
	for _, b := range slices.Concat(old, fresh) {
		if !bytes.Equal(get(t, st, cas.Sum(b)), b) {
			t.Fatalf("%d-byte object differs after commit", len(b))
		}
	}
	noTempFiles(t, st)
}

func (s *suite) testBatchConcurrentPut(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	bt := newBatch(t, st)
	defer bt.Abort()
	// Every goroutine puts the shared blobs (so each has many contenders)
	// and a few of its own.
	var shared [][]byte
	for i := range 6 {
		shared = append(shared, s.content([]int{0, 100, 5000, 300 << 10}[i%4]+i))
	}
	const n = 12
	own := make([][][]byte, n)
	for g := range own {
		for i := range 5 {
			own[g] = append(own[g], s.content(1+g*100+i))
		}
	}
	var mu sync.Mutex
	created := map[cas.ID]int{}
	var errs []error
	putAll(n, func(g int) {
		for _, b := range slices.Concat(shared, own[g]) {
			info, c, err := bt.Put(ctx, bytes.NewReader(b))
			mu.Lock()
			if err != nil {
				errs = append(errs, err)
			} else if info.ID != cas.Sum(b) {
				errs = append(errs, errors.New("wrong id"))
			} else if c {
				created[info.ID]++
			} else if _, ok := created[info.ID]; !ok {
				created[info.ID] = 0
			}
			mu.Unlock()
		}
	})
	if len(errs) > 0 {
		t.Fatalf("concurrent batch puts: %v", errs[0])
	}
	for id, c := range created {
		if c != 1 {
			t.Fatalf("object %s reported created %d times within one batch, want exactly 1", id.Short(), c)
		}
	}
	if want := len(shared) + n*5; len(created) != want {
		t.Fatalf("%d distinct objects seen, want %d", len(created), want)
	}
	if got := list(t, st); len(got) != 0 {
		t.Fatalf("before commit walk lists %d objects", len(got))
	}
	if err := bt.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := list(t, st); len(got) != len(created) {
		t.Fatalf("after commit walk lists %d objects, want %d", len(got), len(created))
	}
	for _, b := range slices.Concat(shared, own[n-1]) {
		if !bytes.Equal(get(t, st, cas.Sum(b)), b) {
			t.Fatalf("%d-byte object differs", len(b))
		}
	}
	noTempFiles(t, st)
}

// A failed Put leaves nothing of its object and does not spoil the batch.
func (s *suite) testBatchPutFailures(t *testing.T) {
	st := s.newStore(t)
	bt := newBatch(t, st)
	defer bt.Abort()
	good := s.content(1000)
	batchPut(t, bt, good)

	var failed [][]byte
	for _, after := range []int{0, 100, 1 << 20} {
		b := s.content(3 << 20)
		ctx, cancel := context.WithCancel(context.Background())
		cr := &cancelReader{r: bytes.NewReader(b), after: after, cancel: cancel}
		_, _, err := bt.Put(ctx, cr)
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("batch put cancelled after %d bytes: err = %v, want context.Canceled", after, err)
		}
		if cr.served >= len(b) {
			t.Fatalf("batch put read all %d bytes despite cancellation after %d", cr.served, after)
		}
		failed = append(failed, b)
	}
	boom := errors.New("boom")
	for _, size := range []int{0, 10, 3 << 20} {
		b := s.content(size)
		_, _, err := bt.Put(context.Background(), &errReader{r: bytes.NewReader(b), err: boom})
		if !errors.Is(err, boom) {
			t.Fatalf("batch put from a reader failing after %d bytes: err = %v", size, err)
		}
		failed = append(failed, b)
	}
	noTempFilesBeyond(t, st, 1)
	// The batch is still usable.
	late := s.content(300 << 10)
	batchPut(t, bt, late)
	if err := bt.Commit(context.Background()); err != nil {
		t.Fatalf("commit after failed puts: %v", err)
	}
	for _, b := range failed {
		assertAbsent(t, st, cas.Sum(b), "failed batch put")
	}
	want := map[cas.ID]int64{cas.Sum(good): int64(len(good)), cas.Sum(late): int64(len(late))}
	if got := list(t, st); !mapsEqual(got, want) {
		t.Fatalf("after commit walk lists %d objects, want the 2 good ones", len(got))
	}
	noTempFiles(t, st)
}

func (s *suite) testBatchCommitCancelled(t *testing.T) {
	st := s.newStore(t)
	bt := newBatch(t, st)
	defer bt.Abort()
	var blobs [][]byte
	for _, size := range []int{5, 4096, 300 << 10} {
		b := s.content(size)
		blobs = append(blobs, b)
		batchPut(t, bt, b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := bt.Commit(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("commit with a cancelled context: err = %v, want context.Canceled", err)
	}
	for _, b := range blobs {
		assertAbsent(t, st, cas.Sum(b), "after cancelled commit")
	}
	noTempFiles(t, st)
	// The batch has ended.
	if err := bt.Commit(context.Background()); !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("commit after a failed commit: err = %v, want ErrFailedPrecondition", err)
	}
	if got := list(t, st); len(got) != 0 {
		t.Fatalf("second commit stored %d objects", len(got))
	}
}

func (s *suite) testBatchEmptyCommit(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	before := put(t, st, s.content(3))
	bt := newBatch(t, st)
	if err := bt.Commit(ctx); err != nil {
		t.Fatalf("commit of an empty batch: %v", err)
	}
	if _, _, err := bt.Put(ctx, bytes.NewReader([]byte("late"))); !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("put after commit: err = %v, want ErrFailedPrecondition", err)
	}
	if err := bt.Commit(ctx); !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("second commit: err = %v, want ErrFailedPrecondition", err)
	}
	bt.Abort()
	if got := list(t, st); len(got) != 1 || got[before.ID] != before.Size {
		t.Fatalf("empty batch changed the store: %d objects", len(got))
	}
	assertAbsent(t, st, cas.Sum([]byte("late")), "put after commit")
	// A batch that only saw stored objects commits to the same store.
	bt = newBatch(t, st)
	defer bt.Abort()
	if _, created := batchPut(t, bt, get(t, st, before.ID)); created {
		t.Fatal("batch put of a stored object: created true")
	}
	if err := bt.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := list(t, st); len(got) != 1 {
		t.Fatalf("batch of a stored object changed the store: %d objects", len(got))
	}
	noTempFiles(t, st)
}

// A plain Put may store an object that an open batch holds; Commit then
// finds it stored, which is success.
func (s *suite) testBatchRaceWithPut(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{20, 300 << 10} {
		st := s.newStore(t)
		bt := newBatch(t, st)
		b := s.content(size)
		other := s.content(size + 1)
		if _, created := batchPut(t, bt, b); !created {
			t.Fatal("batch put of a new object: created false")
		}
		batchPut(t, bt, other)
		if _, created, err := st.Put(ctx, bytes.NewReader(b)); err != nil || !created {
			t.Fatalf("plain put of an object only an open batch holds: created %v, %v", created, err)
		}
		if err := bt.Commit(ctx); err != nil {
			t.Fatalf("commit of an object stored meanwhile: %v", err)
		}
		if got := list(t, st); len(got) != 2 {
			t.Fatalf("walk lists %d objects, want 2", len(got))
		}
		for _, c := range [][]byte{b, other} {
			if !bytes.Equal(get(t, st, cas.Sum(c)), c) {
				t.Fatalf("%d-byte object differs", len(c))
			}
		}
		noTempFiles(t, st)
	}
}

// Two batches holding the same objects both commit; the store ends with one
// copy of each.
func (s *suite) testBatchOverlapping(t *testing.T) {
	ctx := context.Background()
	st := s.newStore(t)
	var blobs [][]byte
	for i := range 40 {
		blobs = append(blobs, s.content(i*997))
	}
	batches := []cas.Batch{newBatch(t, st), newBatch(t, st)}
	for _, bt := range batches {
		defer bt.Abort()
	}
	errs := make([]error, len(batches))
	putAll(len(batches), func(i int) {
		for _, b := range blobs[i*10:] { // overlap on blobs[10:]
			if _, _, err := batches[i].Put(ctx, bytes.NewReader(b)); err != nil {
				errs[i] = err
				return
			}
		}
		errs[i] = batches[i].Commit(ctx)
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
	}
	if got := list(t, st); len(got) != len(blobs) {
		t.Fatalf("walk lists %d objects, want %d", len(got), len(blobs))
	}
	for _, b := range blobs {
		if !bytes.Equal(get(t, st, cas.Sum(b)), b) {
			t.Fatalf("%d-byte object differs", len(b))
		}
	}
	noTempFiles(t, st)
}
