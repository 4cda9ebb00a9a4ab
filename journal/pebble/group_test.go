package pebble_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/esf-dev/esf/journal"
	jpebble "github.com/esf-dev/esf/journal/pebble"
)

// walSyncs wraps the real filesystem, counting the WAL's syncs and letting
// a test hold them (block) or fail them (fail).
type walSyncs struct {
	n     atomic.Int64
	mu    sync.Mutex
	block chan struct{} // non-nil: WAL syncs wait until it is closed
	fail  error
}

func (w *walSyncs) MaybeError(op errorfs.Op) error {
	if !strings.HasSuffix(op.Path, ".log") {
		return nil
	}
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
	default:
		return nil
	}
	w.n.Add(1)
	w.mu.Lock()
	block, fail := w.block, w.fail
	w.mu.Unlock()
	if block != nil {
		<-block
	}
	return fail
}

func (w *walSyncs) String() string { return "walSyncs" }

func (w *walSyncs) hold() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.block = make(chan struct{})
	return w.block
}

func openCounting(t *testing.T) (*jpebble.Store, *walSyncs) {
	t.Helper()
	w := &walSyncs{}
	s, err := jpebble.Open(filepath.Join(t.TempDir(), "db"), jpebble.Options{FS: errorfs.Wrap(vfs.Default, w)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, w
}

// TestGroupCommitSharesOneSync: while one commit's WAL sync is held, other
// Updates still run (the writer lock is not held across the sync), and all
// of them are made durable by a few syncs, not one each. A View that may see
// a commit still being synced does not return before the sync does.
func TestGroupCommitSharesOneSync(t *testing.T) {
	s, w := openCounting(t)
	ctx := t.Context()
	put := func(i int) error {
		return s.Update(ctx, func(tx journal.Tx) error { return tx.Put(fmt.Appendf(nil, "k/%03d", i), []byte("v")) })
	}
	if err := put(0); err != nil { // the store is open and its WAL in use
		t.Fatal(err)
	}
	release := w.hold()
	before := w.n.Load()

	const n = 32
	errs := make(chan error, n)
	go func() { errs <- put(1) }()
	// Wait until put(1)'s sync is held; then the others apply meanwhile.
	entered := make(chan int, n)
	var wg sync.WaitGroup
	for i := 2; i <= n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.Update(ctx, func(tx journal.Tx) error {
				entered <- i
				return tx.Put(fmt.Appendf(nil, "k/%03d", i), []byte("v"))
			})
		}()
	}
	for range n - 1 {
		<-entered // each ran its transaction: no one held the lock while syncing
	}
	viewed := make(chan error, 1)
	go func() {
		viewed <- s.View(ctx, func(r journal.Reader) error {
			_, err := r.Get([]byte("k/001"))
			return err
		})
	}()
	select {
	case err := <-viewed:
		t.Fatalf("a View returned (%v) while the commits it can see were not durable", err)
	case err := <-errs:
		t.Fatalf("an Update returned (%v) before its WAL sync", err)
	default:
	}
	close(release)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if err := <-viewed; err != nil {
		t.Fatal(err)
	}
	if syncs := w.n.Load() - before; syncs > 4 {
		t.Fatalf("%d concurrent Updates took %d WAL syncs, want them grouped (at most 4)", n, syncs)
	}
	for i := 0; i <= n; i++ {
		if err := s.View(ctx, func(r journal.Reader) error { _, err := r.Get(fmt.Appendf(nil, "k/%03d", i)); return err }); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailedWALSyncIsSticky: an Update whose WAL sync fails returns the
// error, and so does every later transaction: what the log holds is unknown.
func TestFailedWALSyncIsSticky(t *testing.T) {
	s, w := openCounting(t)
	ctx := t.Context()
	put := func() error {
		return s.Update(ctx, func(tx journal.Tx) error { return tx.Put([]byte("k"), []byte("v")) })
	}
	if err := put(); err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected EIO")
	w.mu.Lock()
	w.fail = injected
	w.mu.Unlock()
	if err := put(); !errors.Is(err, injected) {
		t.Fatalf("Update with a failing WAL sync: %v, want %v", err, injected)
	}
	w.mu.Lock()
	w.fail = nil
	w.mu.Unlock()
	if err := put(); err == nil {
		t.Fatal("an Update after a failed WAL sync succeeded")
	}
}

// TestCrashDuringConcurrentCommits: crash clones taken while 16 writers
// commit concurrently (their syncs grouped) and a reader watches: every
// fork acknowledged or seen by a View before a clone is in it, whole.
func TestCrashDuringConcurrentCommits(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openFS(t, fs)
	defer s.Close()
	seedCrashGroup(t, s)

	const writers, per = 16, 12
	const n = writers * per
	var mu sync.Mutex
	acked := map[int]bool{}
	seen := map[string]bool{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range per {
				i := j*writers + w
				if _, _, err := forkOnce(ctx, s, i); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				acked[i] = true
				mu.Unlock()
			}
		}()
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for ctx.Err() == nil {
			err := s.View(ctx, func(r journal.Reader) error {
				kids, err := journal.ChildrenOf(r, crashRoot)
				mu.Lock()
				for _, k := range kids {
					seen[k] = true
				}
				mu.Unlock()
				return err
			})
			if err != nil && ctx.Err() == nil {
				errs <- err
				return
			}
		}
	}()
	type clone struct {
		fs   *vfs.MemFS
		must []string
	}
	var clones []clone
	for len(clones) < 10 {
		mu.Lock()
		var must []string
		for i := range acked {
			must = append(must, crashNodeID(i))
		}
		for id := range seen {
			must = append(must, id)
		}
		done := len(acked) == n
		mu.Unlock()
		clones = append(clones, clone{fs.CrashClone(vfs.CrashCloneCfg{}), must})
		if done {
			break
		}
	}
	wg.Wait()
	cancel()
	<-readerDone
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for ci, c := range clones {
		re := openFS(t, c.fs)
		present := checkForkSet(t, re, n)
		for _, id := range c.must {
			if !present[id] {
				t.Fatalf("clone %d: fork %s was acknowledged or read before the crash but is gone", ci, id)
			}
		}
		t.Logf("clone %d: %d acknowledged or read, %d present", ci, len(c.must), len(present))
		if err := re.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkForkSet is checkForks for concurrent writers: the forks present are
// any set, but each is whole and the indexes, counter and events agree.
func checkForkSet(t *testing.T, s journal.Store, attempted int) map[string]bool {
	t.Helper()
	present := map[string]bool{}
	err := s.View(context.Background(), func(r journal.Reader) error {
		for i := range attempted {
			id := crashNodeID(i)
			_, nodeErr := journal.GetNode(r, id)
			res, idemFound, err := journal.CheckIdempotency(r, fmt.Sprintf("fork-%d", i), "fork", forkRequest{Parent: crashRoot, Child: id})
			if err != nil {
				return err
			}
			if idemFound && string(res) != wantResult(t, i) {
				return fmt.Errorf("fork %d: recorded result %.100s is not what was written", i, res)
			}
			if nodeErr != nil && !errors.Is(nodeErr, journal.ErrNotFound) {
				return nodeErr
			}
			if (nodeErr == nil) != idemFound {
				return fmt.Errorf("fork %d torn: node present %v, idempotency entry present %v", i, nodeErr == nil, idemFound)
			}
			if idemFound {
				present[id] = true
			}
		}
		kids, err := journal.ChildrenOf(r, crashRoot)
		if err != nil {
			return err
		}
		forks, err := journal.Counter(r, "forks")
		if err != nil {
			return err
		}
		seq, err := r.LastSeq()
		if err != nil {
			return err
		}
		k := len(present)
		if len(kids) != k || int(forks) != k || int(seq) != k {
			return fmt.Errorf("%d forks present, but %d child index keys, counter %d, last event %d", k, len(kids), forks, seq)
		}
		return r.Events(0, func(ev journal.Event) error {
			if !present[ev.NodeID] {
				return fmt.Errorf("event %d is for %s, which is not present", ev.Seq, ev.NodeID)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return present
}
