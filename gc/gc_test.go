package gc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/gc"
)

var stores = []struct {
	name string
	open func(t testing.TB) cas.Store
}{
	{"mem", func(t testing.TB) cas.Store { return mem.New() }},
	{"local", func(t testing.TB) cas.Store {
		s, err := local.Open(t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

// putBlob stores content and returns its file entry.
func putBlob(t testing.TB, st cas.Putter, content string) cas.Entry {
	t.Helper()
	info, _, err := st.Put(context.Background(), strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	return cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: info.Size, ID: info.ID}
}

// buildFiles writes a tree holding files (path -> content).
func buildFiles(t testing.TB, st cas.Store, base cas.ID, files map[string]string) cas.ID {
	t.Helper()
	ctx := context.Background()
	b := cas.NewBuilder(st, base)
	for p, c := range files {
		if err := b.Put(ctx, p, putBlob(t, st, c), ""); err != nil {
			t.Fatal(err)
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// objects lists every stored object with its size.
func objects(t testing.TB, s cas.Walker) map[cas.ID]int64 {
	t.Helper()
	out := map[cas.ID]int64{}
	if err := s.Walk(context.Background(), func(i cas.Info) error { out[i.ID] = i.Size; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func reachable(t testing.TB, g cas.Getter, roots ...cas.ID) *gc.Set {
	t.Helper()
	s := gc.NewSet()
	if err := gc.Mark(context.Background(), g, roots, nil, s.Add); err != nil {
		t.Fatal(err)
	}
	return s
}

// verifyReachable reads every object reachable from roots to its end
// (trees and blobs, each verified against its id) and runs cas.Fsck over
// the whole store.
func verifyReachable(t testing.TB, s cas.Store, roots []cas.ID) {
	t.Helper()
	ctx := context.Background()
	live := reachable(t, s, roots...)
	var missing []string
	err := gc.Mark(ctx, s, roots, nil, func(id cas.ID) {
		if _, err := cas.ReadAll(ctx, s, id); err != nil {
			missing = append(missing, fmt.Sprintf("%s: %v", id.Short(), err))
		}
	})
	if err != nil {
		t.Fatalf("walk the roots: %v", err)
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d reachable objects unreadable: %v", len(missing), live.Len(), missing)
	}
	res, err := cas.Fsck(ctx, s, nil)
	if err != nil || len(res.Bad) > 0 {
		t.Fatalf("fsck: %v, bad %v", err, res.Bad)
	}
}

// getCounter counts Gets per id.
type getCounter struct {
	cas.Getter
	mu sync.Mutex
	n  map[cas.ID]int
}

func (g *getCounter) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	g.mu.Lock()
	g.n[id]++
	g.mu.Unlock()
	return g.Getter.Get(ctx, id)
}

func TestMark(t *testing.T) {
	st := mem.New()
	ctx := context.Background()
	shared := buildFiles(t, st, cas.ZeroID, map[string]string{"s/a": "a", "s/b": "b", "s/deep/c": "c"})
	r1 := buildFiles(t, st, shared, map[string]string{"one": "1"})
	r2 := buildFiles(t, st, shared, map[string]string{"two": "2"})
	extra := putBlob(t, st, "evidence").ID

	gcount := &getCounter{Getter: st, n: map[cas.ID]int{}}
	marked := map[cas.ID]int{}
	if err := gc.Mark(ctx, gcount, []cas.ID{r1, r2, r1, cas.ZeroID}, []cas.ID{extra}, func(id cas.ID) { marked[id]++ }); err != nil {
		t.Fatal(err)
	}
	want := reachable(t, st, r1)
	for _, id := range []cas.ID{r2, extra, putBlob(t, st, "2").ID} {
		want.Add(id)
	}
	if len(marked) != want.Len() {
		t.Errorf("marked %d objects, want %d", len(marked), want.Len())
	}
	for id := range marked {
		if !want.Has(id) {
			t.Errorf("marked %s, which is not reachable", id.Short())
		}
	}
	for id, n := range gcount.n {
		if n != 1 {
			t.Errorf("tree %s read %d times", id.Short(), n)
		}
		if id == extra {
			t.Errorf("extra object read")
		}
	}
	if len(gcount.n) != 4 { // r1, r2, s, s/deep
		t.Errorf("read %d trees, want 4", len(gcount.n))
	}

	// A missing tree stops the mark.
	tr, _ := cas.ReadTree(ctx, st, r1)
	s, _ := tr.Lookup("s")
	if err := st.Delete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := gc.Mark(ctx, st, []cas.ID{r1}, nil, func(cas.ID) {}); !errors.Is(err, cas.ErrNotFound) {
		t.Errorf("missing tree: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := gc.Mark(cctx, st, []cas.ID{r2}, nil, func(cas.ID) {}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// world is a store with live roots and garbage (unreachable trees and
// blobs, some blobs shared with live trees).
type world struct {
	live    []cas.ID
	dead    []cas.ID         // garbage roots
	garbage map[cas.ID]int64 // id -> size
	blobs   map[cas.ID]string
}

func makeWorld(t testing.TB, st cas.Store, r *rand.Rand) world {
	w := world{blobs: map[cas.ID]string{}}
	files := func(prefix string, n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			c := fmt.Sprintf("%s content %d %d", prefix, i, r.IntN(1000))
			if r.IntN(4) == 0 {
				c = fmt.Sprintf("shared content %d", r.IntN(10))
			}
			m[fmt.Sprintf("d%d/e%d/f%d", r.IntN(3), r.IntN(3), i)] = c
		}
		return m
	}
	var all []cas.ID
	for i := range 6 {
		fs := files(fmt.Sprintf("tree%d", i), 30)
		root := buildFiles(t, st, cas.ZeroID, fs)
		all = append(all, root)
		for _, c := range fs {
			w.blobs[cas.Sum([]byte(c))] = c
		}
	}
	w.live, w.dead = all[:3], all[3:]
	live := reachable(t, st, w.live...)
	w.garbage = map[cas.ID]int64{}
	for id, size := range objects(t, st) {
		if !live.Has(id) {
			w.garbage[id] = size
		}
	}
	if len(w.garbage) == 0 {
		t.Fatal("no garbage")
	}
	return w
}

func (w world) garbageBlobs() []cas.ID {
	var out []cas.ID
	for id := range w.garbage {
		if _, ok := w.blobs[id]; ok {
			out = append(out, id)
		}
	}
	// Sorted, so that a seed replays the same choices.
	slices.SortFunc(out, func(a, b cas.ID) int { return bytes.Compare(a[:], b[:]) })
	return out
}

func sumSizes(m map[cas.ID]int64) int64 {
	var n int64
	for _, s := range m {
		n += s
	}
	return n
}

func TestSweep(t *testing.T) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			st := sc.open(t)
			ctx := context.Background()
			w := makeWorld(t, st, rand.New(rand.NewPCG(1, 1)))
			before := objects(t, st)
			live := reachable(t, st, w.live...)

			// A dry run counts and deletes nothing.
			rep, err := gc.Sweep(ctx, st, live.Has, gc.SweepOptions{DryRun: true})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Examined != int64(len(before)) || rep.Deleted != int64(len(w.garbage)) ||
				rep.BytesReclaimed != sumSizes(w.garbage) || !rep.DryRun {
				t.Errorf("dry run %+v; want %d examined, %d deleted, %d bytes", rep, len(before), len(w.garbage), sumSizes(w.garbage))
			}
			if n := len(objects(t, st)); n != len(before) {
				t.Errorf("dry run deleted %d objects", len(before)-n)
			}

			// Protect spares what it names.
			var spare cas.ID
			for id := range w.garbage {
				spare = id
				break
			}
			rep, err = gc.Sweep(ctx, st, live.Has, gc.SweepOptions{BatchSize: 7, Pause: time.Microsecond,
				Protect: func(id cas.ID) bool { return id == spare }})
			if err != nil {
				t.Fatal(err)
			}
			after := objects(t, st)
			for id := range before {
				_, kept := after[id]
				_, dead := w.garbage[id]
				if kept == (dead && id != spare) {
					t.Errorf("%s: kept %v, garbage %v", id.Short(), kept, dead)
				}
			}
			if rep.Deleted != int64(len(w.garbage)-1) || rep.BytesReclaimed != sumSizes(w.garbage)-w.garbage[spare] {
				t.Errorf("report %+v, want %d objects, %d bytes", rep, len(w.garbage)-1, sumSizes(w.garbage)-w.garbage[spare])
			}
			verifyReachable(t, st, w.live)

			// Nothing left to do: idempotent.
			rep, err = gc.Sweep(ctx, st, func(id cas.ID) bool { return live.Has(id) || id == spare }, gc.SweepOptions{})
			if err != nil || rep.Deleted != 0 {
				t.Errorf("second sweep: %+v %v", rep, err)
			}
		})
	}
}

func TestSweepCancelBetweenBatches(t *testing.T) {
	st := mem.New()
	w := makeWorld(t, st, rand.New(rand.NewPCG(2, 2)))
	live := reachable(t, st, w.live...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	rep, err := gc.Sweep(ctx, st, live.Has, gc.SweepOptions{BatchSize: 2, Pause: 5 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sweep: %+v %v", rep, err)
	}
	if rep.Deleted == 0 || rep.Deleted >= int64(len(w.garbage)) {
		t.Errorf("a cancelled sweep deleted %d of %d", rep.Deleted, len(w.garbage))
	}
	if got := int64(len(w.garbage)) - rep.Deleted; got != int64(len(objects(t, st))-live.Len()) {
		t.Errorf("report disagrees with the store")
	}
	verifyReachable(t, st, w.live)
}

func TestTrackerRecords(t *testing.T) {
	st := mem.New()
	tr := gc.NewTracker(st)
	ctx := context.Background()
	old := putBlob(t, st, "old").ID
	hasID, statID := putBlob(t, st, "has").ID, putBlob(t, st, "stat").ID

	// Nothing is recorded outside an epoch.
	putBlob(t, tr, "before")
	ep, err := tr.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Begin(); !errors.Is(err, gc.ErrBusy) || !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Errorf("second Begin: %v", err)
	}
	if ep.Protected(cas.Sum([]byte("before"))) {
		t.Error("a Put before the epoch is recorded")
	}
	if _, created, err := tr.Put(ctx, strings.NewReader("old")); err != nil || created {
		t.Fatalf("re-put: %v %v", created, err)
	}
	newID := putBlob(t, tr, "new").ID
	if ok, err := tr.Has(ctx, hasID); !ok || err != nil {
		t.Fatal(ok, err)
	}
	missing := cas.Sum([]byte("missing"))
	tr.Has(ctx, missing)
	if _, err := tr.Stat(ctx, statID); err != nil {
		t.Fatal(err)
	}
	b := tr.NewBatch()
	if _, _, err := b.Put(ctx, strings.NewReader("batched")); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ep.Protect(cas.Sum([]byte("by hand")))
	for name, id := range map[string]cas.ID{"re-put": old, "put": newID, "has": hasID, "has miss": missing,
		"stat": statID, "batch": cas.Sum([]byte("batched")), "protect": cas.Sum([]byte("by hand"))} {
		if !ep.Protected(id) {
			t.Errorf("%s: not recorded", name)
		}
	}
	if _, err := tr.Get(ctx, cas.Sum([]byte("has"))); err != nil {
		t.Fatal(err)
	}
	ep.End()
	ep.End()
	putBlob(t, tr, "after")
	if ep.Protected(cas.Sum([]byte("after"))) {
		t.Error("recorded after End")
	}
	if _, err := tr.Begin(); err != nil {
		t.Errorf("Begin after End: %v", err)
	}
}

// Note records an id in the open epoch without asking the store, so a
// collection keeps it, and the Tracker forwards its store's deletion count
// (ok false for a store that does not count).
func TestTrackerNoteProtects(t *testing.T) {
	ctx := context.Background()
	if _, ok := gc.NewTracker(mem.New()).Deletions(); ok {
		t.Error("a Tracker over the memory store claims to count deletions")
	}
	st, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tr := gc.NewTracker(st)
	noted, other := putBlob(t, st, "noted").ID, putBlob(t, st, "other").ID
	n0, ok := tr.Deletions()
	if !ok {
		t.Fatal("a Tracker over the disk store does not count deletions")
	}
	ep, err := tr.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.End()
	ctx, rec := gc.WithRecorder(ctx)
	tr.Note(ctx, noted)
	if !ep.Protected(noted) || rec.Len() != 1 {
		t.Fatalf("Note: protected %v, %d recorded; want true, 1", ep.Protected(noted), rec.Len())
	}
	for id, want := range map[cas.ID]bool{noted: false, other: true} {
		if _, deleted, err := tr.DeleteUnless(ctx, id, func(cas.ID) bool { return false }); err != nil || deleted != want {
			t.Fatalf("DeleteUnless: deleted %v, %v; want %v", deleted, err, want)
		}
	}
	if ok, _ := st.Has(ctx, noted); !ok {
		t.Fatal("the noted object was collected")
	}
	if n, _ := tr.Deletions(); n == n0 {
		t.Fatal("a collection's deletion did not move the count")
	}
}

// TestDeleteUnlessOrdersWriters stores, through the Tracker, the very object
// the sweep is deleting, from inside the deletion: the writer's record waits
// for the deletion, so its Put finds nothing and stores the object again.
func TestDeleteUnlessOrdersWriters(t *testing.T) {
	st := mem.New()
	tr := gc.NewTracker(st)
	ctx := context.Background()
	victim := putBlob(t, st, "victim").ID
	ep, err := tr.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.End()
	type result struct {
		created bool
		err     error
	}
	done := make(chan result, 1)
	var once sync.Once
	st.SetFault(func(op mem.Op, id cas.ID) error {
		if op == mem.OpDelete && id == victim {
			once.Do(func() {
				go func() {
					_, created, err := tr.Put(ctx, strings.NewReader("victim"))
					done <- result{created, err}
				}()
				// Give the writer every chance to overtake the deletion;
				// the stripe lock must not let it.
				time.Sleep(20 * time.Millisecond)
			})
		}
		return nil
	})
	_, deleted, err := tr.DeleteUnless(ctx, victim, func(cas.ID) bool { return false })
	if err != nil || !deleted {
		t.Fatalf("DeleteUnless: %v %v", deleted, err)
	}
	r := <-done
	if r.err != nil || !r.created {
		t.Fatalf("the concurrent Put: created %v, err %v; want it to store the object again", r.created, r.err)
	}
	if ok, _ := st.Has(ctx, victim); !ok {
		t.Fatal("the object a writer stored is gone")
	}
	// Now recorded: a second sweep keeps it.
	if _, deleted, err := tr.DeleteUnless(ctx, victim, func(cas.ID) bool { return false }); err != nil || deleted {
		t.Fatalf("second DeleteUnless: %v %v", deleted, err)
	}
}

func TestEpochWaitsForOlderSessions(t *testing.T) {
	tr := gc.NewTracker(mem.New())
	leaveOld := tr.Enter()
	ep, err := tr.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer ep.End()
	leaveNew := tr.Enter()
	defer leaveNew()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := ep.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with an older session open: %v", err)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		leaveOld()
		leaveOld()
	}()
	if err := ep.Wait(context.Background()); err != nil {
		t.Fatalf("Wait after the older session left: %v", err)
	}
}

// TestCollectKeepsSessionDeps: a tree no root names (its node was pruned
// after a session checked it) survives while a session builds on it.
func TestCollectKeepsSessionDeps(t *testing.T) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			st := sc.open(t)
			tr := gc.NewTracker(st)
			ctx := context.Background()
			w := makeWorld(t, st, rand.New(rand.NewPCG(3, 3)))
			dep := w.dead[0]
			// A session older than the collection holds it up.
			leave := tr.Enter(dep)
			roots := func(context.Context) ([]cas.ID, []cas.ID, error) { return w.live, nil, nil }
			tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			if _, err := gc.Collect(tctx, tr, roots, gc.SweepOptions{}); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("collect with an older session open: %v", err)
			}
			leave()
			// A session that enters once the collection began, before its
			// roots are read (while they are, here), keeps its deps.
			withSession := func(ctx context.Context) ([]cas.ID, []cas.ID, error) {
				leave = tr.Enter(dep)
				return w.live, nil, nil
			}
			rep, err := gc.Collect(ctx, tr, withSession, gc.SweepOptions{})
			if err != nil {
				t.Fatal(err)
			}
			verifyReachable(t, st, append([]cas.ID{dep}, w.live...))
			held, under := 0, reachable(t, st, dep)
			for id := range w.garbage {
				if under.Has(id) {
					held++
				}
			}
			leave()
			rep2, err := gc.Collect(ctx, tr, roots, gc.SweepOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Deleted != int64(len(w.garbage)-held) || rep2.Deleted != int64(held) {
				t.Errorf("deleted %d then %d; garbage %d, %d of it under the dep", rep.Deleted, rep2.Deleted, len(w.garbage), held)
			}
			verifyReachable(t, st, w.live)
		})
	}
}

// deleteRecorder records what the store really deleted.
type deleteRecorder struct {
	cas.Store
	mu      sync.Mutex
	deleted map[cas.ID]int
}

func (d *deleteRecorder) Delete(ctx context.Context, id cas.ID) error {
	if err := d.Store.Delete(ctx, id); err != nil {
		return err
	}
	d.mu.Lock()
	d.deleted[id]++
	d.mu.Unlock()
	return nil
}

// TestCollectWithConcurrentWriters races writers against a collection.
// The writers, in sessions, build new roots on live ones, store new blobs,
// store again the bytes of garbage blobs, and reuse garbage blobs by id
// after Has finds them. Afterwards every root, old and new, reads back
// verified, fsck is clean, nothing but initial garbage was deleted, every
// garbage object no writer touched was deleted, and the report's counts
// are exactly what was deleted. Replay with ESF_GC_SEED.
func TestCollectWithConcurrentWriters(t *testing.T) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			seed := seedFromEnv(t, "ESF_GC_SEED")
			inner := sc.open(t)
			rec := &deleteRecorder{Store: inner, deleted: map[cas.ID]int{}}
			tr := gc.NewTracker(rec)
			ctx := context.Background()
			w := makeWorld(t, inner, rand.New(rand.NewPCG(seed, 1)))
			// Writers touch only half of the garbage blobs, so the other
			// half must go.
			garbageBlobs := w.garbageBlobs()
			garbageBlobs = garbageBlobs[:len(garbageBlobs)/2]

			var (
				mu        sync.Mutex
				committed []cas.ID
				touched   = map[cas.ID]bool{}
			)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			started := make(chan struct{}, 2)
			for wid := range 2 {
				r := rand.New(rand.NewPCG(seed, uint64(wid)+10))
				wg.Go(func() {
					for i := 0; ; i++ {
						if i == 1 {
							started <- struct{}{}
						}
						select {
						case <-stop:
							if i > 5 {
								return
							}
						default:
						}
						if err := writeOnce(ctx, tr, w, garbageBlobs, r, wid, i, &mu, &committed, touched); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			<-started
			<-started
			roots := func(context.Context) ([]cas.ID, []cas.ID, error) {
				mu.Lock()
				defer mu.Unlock()
				return append(append([]cas.ID(nil), w.live...), committed...), nil, nil
			}
			rep, err := gc.Collect(ctx, tr, roots, gc.SweepOptions{BatchSize: 8, Pause: 200 * time.Microsecond})
			close(stop)
			wg.Wait()
			if err != nil {
				t.Fatal(err)
			}

			all := append(append([]cas.ID(nil), w.live...), committed...)
			verifyReachable(t, inner, all)
			var reclaimed int64
			for id, n := range rec.deleted {
				size, isGarbage := w.garbage[id]
				if !isGarbage {
					t.Errorf("deleted %s, which was not garbage", id.Short())
				}
				if n != 1 {
					t.Errorf("deleted %s %d times", id.Short(), n)
				}
				reclaimed += size
			}
			for id := range w.garbage {
				if !touched[id] && rec.deleted[id] == 0 {
					t.Errorf("garbage %s no writer touched survived", id.Short())
				}
			}
			if rep.Deleted != int64(len(rec.deleted)) || rep.BytesReclaimed != reclaimed {
				t.Errorf("report %+v; the store deleted %d objects, %d bytes", rep, len(rec.deleted), reclaimed)
			}
			recreated := 0
			for id := range rec.deleted {
				if touched[id] {
					if ok, _ := inner.Has(ctx, id); ok {
						recreated++
					}
				}
			}
			t.Logf("%d roots committed by writers; %d garbage objects (%d bytes); deleted %d (%d bytes), %d of them stored again by a writer; %d spared",
				len(committed), len(w.garbage), sumSizes(w.garbage), rep.Deleted, rep.BytesReclaimed, recreated, rep.Spared)
		})
	}
}

// writeOnce is one writer session: a new root on a live one, holding a new
// blob, a garbage blob stored again and a garbage blob reused after Has.
func writeOnce(ctx context.Context, tr *gc.Tracker, w world, garbageBlobs []cas.ID, r *rand.Rand, wid, i int,
	mu *sync.Mutex, committed *[]cas.ID, touched map[cas.ID]bool) error {
	base := w.live[r.IntN(len(w.live))]
	leave := tr.Enter(base)
	defer leave()
	b := cas.NewBuilder(tr, base)
	entry := func(info cas.Info) cas.Entry {
		return cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: info.Size, ID: info.ID}
	}
	dir := fmt.Sprintf("writer%d/round%d", wid, i)
	info, _, err := tr.Put(ctx, strings.NewReader(fmt.Sprintf("writer %d new blob %d", wid, i)))
	if err != nil {
		return err
	}
	if err := b.Put(ctx, dir+"/new", entry(info), ""); err != nil {
		return err
	}
	again := garbageBlobs[r.IntN(len(garbageBlobs))]
	mu.Lock()
	touched[again] = true
	mu.Unlock()
	if info, _, err = tr.Put(ctx, strings.NewReader(w.blobs[again])); err != nil {
		return err
	}
	if err := b.Put(ctx, dir+"/again", entry(info), ""); err != nil {
		return err
	}
	reuse := garbageBlobs[r.IntN(len(garbageBlobs))]
	mu.Lock()
	touched[reuse] = true
	mu.Unlock()
	ok, err := tr.Has(ctx, reuse)
	if err != nil {
		return err
	}
	e := entry(cas.Info{ID: reuse, Size: int64(len(w.blobs[reuse]))})
	if !ok {
		// Collected already: store it (dedup missed, so write).
		if _, _, err := tr.Put(ctx, strings.NewReader(w.blobs[reuse])); err != nil {
			return err
		}
	}
	if err := b.Put(ctx, dir+"/reused", e, ""); err != nil {
		return err
	}
	root, err := b.Write(ctx, tr)
	if err != nil {
		return err
	}
	mu.Lock()
	*committed = append(*committed, root)
	mu.Unlock()
	return nil
}

func seedFromEnv(t *testing.T, name string) uint64 {
	t.Helper()
	var seed uint64
	if s := os.Getenv(name); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("%s=%q: %v", name, s, err)
		}
	} else {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (replay with %s=%d)", seed, name, seed)
	return seed
}

// failingDeleter fails the deletion of one id.
type failingDeleter struct {
	cas.Store
	bad cas.ID
}

func (f failingDeleter) Delete(ctx context.Context, id cas.ID) error {
	if id == f.bad {
		return errors.New("disk on fire")
	}
	return f.Store.Delete(ctx, id)
}

// TestSweepWorkersStopAtAnError: with parallel workers, a failed deletion
// stops the sweep with that error, and the report counts exactly what the
// store lost.
func TestSweepWorkersStopAtAnError(t *testing.T) {
	st := mem.New()
	w := makeWorld(t, st, rand.New(rand.NewPCG(3, 3)))
	live := reachable(t, st, w.live...)
	var bad cas.ID
	for id := range w.garbage {
		bad = id
		break
	}
	before := len(objects(t, st))
	rep, err := gc.Sweep(context.Background(), failingDeleter{st, bad}, live.Has, gc.SweepOptions{Workers: 8, BatchSize: 4})
	if err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("sweep: %+v %v, want the deletion's error", rep, err)
	}
	if got := int64(before - len(objects(t, st))); got != rep.Deleted {
		t.Errorf("report says %d deleted, the store lost %d", rep.Deleted, got)
	}
	if _, ok := objects(t, st)[bad]; !ok {
		t.Error("the object whose deletion failed is gone")
	}
	verifyReachable(t, st, w.live)
}
