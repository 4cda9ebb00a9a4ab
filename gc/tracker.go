package gc

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/esf-dev/esf/cas"
)

// Tracker is the store every writer goes through, so that a collection can
// run while they write. It is a cas.Store (and cas.Batcher) decorator.
//
// While an Epoch is open it records, in the epoch's set, every id that a
// writer could go on to reference:
//   - every object a Put stores or finds already stored, recorded when the
//     Put's reader reaches EOF: that is before any store can know the id, so
//     before it decides whether the object exists;
//   - every id passed to Has or Stat, recorded before the store is asked
//     (dedup: a writer that finds an object references it without a Put).
//
// DeleteUnless checks that set and deletes under the same per-id lock that
// recording takes. So for every object either the writer's record comes
// first and the object is kept, or the deletion comes first and the
// writer's store finds nothing and writes the object again.
//
// Sessions (Enter) cover the rest: writes that began before the epoch, and
// trees referenced by id without any store call. See the package
// documentation for the caller's contract.
type Tracker struct {
	s       cas.Store
	epoch   atomic.Pointer[Epoch]
	stripes [64]sync.Mutex

	mu      sync.Mutex
	gen     uint64         // generation of sessions entering now
	open    map[uint64]int // open sessions per generation
	deps    map[*session]struct{}
	changed chan struct{} // closed and replaced whenever a session leaves
}

type session struct {
	deps []cas.ID
}

var (
	_ cas.Store           = (*Tracker)(nil)
	_ cas.Batcher         = (*Tracker)(nil)
	_ GuardedDeleter      = (*Tracker)(nil)
	_ cas.DeletionCounter = (*Tracker)(nil)
)

// NewTracker wraps s.
func NewTracker(s cas.Store) *Tracker {
	return &Tracker{s: s, open: map[uint64]int{}, deps: map[*session]struct{}{}, changed: make(chan struct{})}
}

// Unwrap returns the wrapped store.
func (t *Tracker) Unwrap() cas.Store { return t.s }

func (t *Tracker) stripe(id cas.ID) *sync.Mutex { return &t.stripes[id[0]%byte(len(t.stripes))] }

// record adds id to the open epoch, if any.
func (t *Tracker) record(id cas.ID) {
	ep := t.epoch.Load()
	if ep == nil {
		return
	}
	mu := t.stripe(id)
	mu.Lock()
	ep.set.Add(id)
	mu.Unlock()
}

// Recorder collects, for one write session, the ids it stores or finds
// through a Tracker (what Put, batch Puts, Has and Stat with a context from
// WithRecorder record), whether or not an epoch is open. A remote
// collection on another worker cannot see this process's epochs; the
// session uses the ids to make its content durable again when such a
// collection overlapped it (fabric's remote GC protocol).
type Recorder struct {
	mu  sync.Mutex
	ids map[cas.ID]struct{}
}

type recorderKey struct{}

// WithRecorder returns ctx with a new Recorder, or ctx and the Recorder it
// already carries (a session inside another records into the outer one).
func WithRecorder(ctx context.Context) (context.Context, *Recorder) {
	if r := RecorderFrom(ctx); r != nil {
		return ctx, r
	}
	r := &Recorder{ids: map[cas.ID]struct{}{}}
	return context.WithValue(ctx, recorderKey{}, r), r
}

// RecorderFrom returns the Recorder ctx carries, or nil.
func RecorderFrom(ctx context.Context) *Recorder {
	r, _ := ctx.Value(recorderKey{}).(*Recorder)
	return r
}

func (r *Recorder) add(id cas.ID) {
	r.mu.Lock()
	r.ids[id] = struct{}{}
	r.mu.Unlock()
}

// Len is how many ids are recorded.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// IDs returns the recorded ids.
func (r *Recorder) IDs() []cas.ID {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]cas.ID, 0, len(r.ids))
	for id := range r.ids {
		ids = append(ids, id)
	}
	return ids
}

// recordCtx records id in ctx's Recorder, if any.
func recordCtx(ctx context.Context, id cas.ID) {
	if r := RecorderFrom(ctx); r != nil {
		r.add(id)
	}
}

// Get implements cas.Getter. Reads are not recorded: what a writer reads
// to build on must come from a live root or a session's deps.
func (t *Tracker) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	return t.s.Get(ctx, id)
}

// Put implements cas.Putter.
func (t *Tracker) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	return t.put(ctx, t.s, r)
}

func (t *Tracker) put(ctx context.Context, p cas.Putter, r io.Reader) (cas.Info, bool, error) {
	return t.putWith(ctx, r, func(r io.Reader) (cas.Info, bool, error) { return p.Put(ctx, r) })
}

// putWith records what put(r) stores, as put does.
func (t *Tracker) putWith(ctx context.Context, r io.Reader, put func(io.Reader) (cas.Info, bool, error)) (cas.Info, bool, error) {
	if t.epoch.Load() != nil {
		// A Put that starts before the epoch belongs to a session that
		// started before it, which the collection waits for.
		r = &recordingReader{r: r, h: cas.NewHasher(), t: t}
	}
	info, created, err := put(r)
	if err != nil {
		return info, created, err
	}
	t.record(info.ID)
	recordCtx(ctx, info.ID)
	return info, created, nil
}

// Has implements cas.Haser.
func (t *Tracker) Has(ctx context.Context, id cas.ID) (bool, error) {
	t.record(id)
	recordCtx(ctx, id)
	return t.s.Has(ctx, id)
}

// Note records id as Has does, without asking the store: for a caller
// that knows id is stored (its store's cas.DeletionCounter has not moved
// since it saw it). A collection running meanwhile keeps id, as it keeps
// what Has found.
func (t *Tracker) Note(ctx context.Context, id cas.ID) {
	t.record(id)
	recordCtx(ctx, id)
}

// Deletions implements cas.DeletionCounter for the wrapped store (ok
// false when it does not count).
func (t *Tracker) Deletions() (uint64, bool) {
	if dc, ok := t.s.(cas.DeletionCounter); ok {
		return dc.Deletions()
	}
	return 0, false
}

// Stat implements cas.Statter.
func (t *Tracker) Stat(ctx context.Context, id cas.ID) (cas.Info, error) {
	t.record(id)
	recordCtx(ctx, id)
	return t.s.Stat(ctx, id)
}

// Walk implements cas.Walker.
func (t *Tracker) Walk(ctx context.Context, fn func(cas.Info) error) error {
	return t.s.Walk(ctx, fn)
}

// Delete implements cas.Deleter. It deletes unconditionally: collections
// use DeleteUnless.
func (t *Tracker) Delete(ctx context.Context, id cas.ID) error {
	return t.s.Delete(ctx, id)
}

// DeleteUnless implements GuardedDeleter: it keeps id if keep says so or the
// open epoch recorded it, and otherwise deletes it, all under id's lock.
func (t *Tracker) DeleteUnless(ctx context.Context, id cas.ID, keep func(cas.ID) bool) (cas.Info, bool, error) {
	mu := t.stripe(id)
	mu.Lock()
	defer mu.Unlock()
	if ep := t.epoch.Load(); (ep != nil && ep.set.Has(id)) || keep(id) {
		return cas.Info{}, false, nil
	}
	// Stat the store itself: recording our own look would protect it.
	info, err := t.s.Stat(ctx, id)
	if errors.Is(err, cas.ErrNotFound) {
		return cas.Info{}, false, nil
	}
	if err != nil {
		return cas.Info{}, false, err
	}
	if err := t.s.Delete(ctx, id); err != nil {
		return cas.Info{}, false, err
	}
	return info, true, nil
}

// Guard runs fn holding the locks that writers' records of ids take, with
// keep reporting the ids the open epoch recorded (false for all without an
// epoch). A deletion fn makes of an id keep does not report is atomic with
// respect to writers as DeleteUnless's is; it is for deletions outside the
// wrapped store (the remote tier behind a cache). Locks are taken in stripe
// order, so concurrent Guards do not deadlock.
func (t *Tracker) Guard(ids []cas.ID, fn func(keep func(cas.ID) bool) error) error {
	var held [64]bool
	for _, id := range ids {
		held[id[0]%byte(len(t.stripes))] = true
	}
	for i := range t.stripes {
		if held[i] {
			t.stripes[i].Lock()
		}
	}
	defer func() {
		for i := range t.stripes {
			if held[i] {
				t.stripes[i].Unlock()
			}
		}
	}()
	ep := t.epoch.Load()
	return fn(func(id cas.ID) bool { return ep != nil && ep.set.Has(id) })
}

// NewBatch implements cas.Batcher: the wrapped store's batch (or plain
// Puts), recorded like Put.
func (t *Tracker) NewBatch() cas.Batch {
	return &trackedBatch{Batch: cas.NewBatch(t.s), t: t}
}

type trackedBatch struct {
	cas.Batch
	t *Tracker
}

func (b *trackedBatch) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	return b.t.put(ctx, b.Batch, r)
}

// Adopt implements cas.Adopter, recorded like Put.
func (b *trackedBatch) Adopt(ctx context.Context, f *os.File, r io.Reader) (cas.Info, bool, error) {
	return b.t.putWith(ctx, r, func(r io.Reader) (cas.Info, bool, error) { return cas.Adopt(ctx, b.Batch, f, r) })
}

// recordingReader hashes what the store reads and records the id when the
// reader returns io.EOF, which every store must see before it can name the
// object.
type recordingReader struct {
	r    io.Reader
	h    hash.Hash
	t    *Tracker
	done bool
}

func (rr *recordingReader) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	rr.h.Write(p[:n])
	if err == io.EOF && !rr.done {
		rr.done = true
		rr.t.record(cas.IDFromHash(rr.h))
	}
	return n, err
}

// Enter opens a write session and returns the function that closes it.
// A session is any work that stores objects and later commits a root that
// references them (import, seal, merge), or that references existing trees
// by id without reading them through a Put or Has (fork, seal's unchanged
// directories, merge's heads). deps are those trees: the roots the session
// builds on. A collection keeps them and everything below them alive while
// the session is open, and waits for sessions that entered before it began
// (Epoch.Wait). Close the session after the root is committed (or the work
// abandoned); leave is idempotent.
//
// Enter before checking that deps are still live (not pruned): then a
// collection that missed them in its roots finds them in the session.
func (t *Tracker) Enter(deps ...cas.ID) (leave func()) {
	s := &session{deps: slices.Clone(deps)}
	t.mu.Lock()
	g := t.gen
	t.open[g]++
	t.deps[s] = struct{}{}
	t.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			if t.open[g]--; t.open[g] == 0 {
				delete(t.open, g)
			}
			delete(t.deps, s)
			close(t.changed)
			t.changed = make(chan struct{})
		})
	}
}

// Epoch is one collection's view of the Tracker: the ids writers recorded
// since it began, and the sessions it must respect.
type Epoch struct {
	t     *Tracker
	gen   uint64
	set   *Set
	ended atomic.Bool
}

// ErrBusy is returned by Begin while another epoch is open: one collection
// at a time per store.
var ErrBusy = fmt.Errorf("a collection is already running: %w", cas.ErrFailedPrecondition)

// Begin opens an epoch: from now until End, writers' ids are recorded.
func (t *Tracker) Begin() (*Epoch, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.epoch.Load() != nil {
		return nil, ErrBusy
	}
	t.gen++
	ep := &Epoch{t: t, gen: t.gen, set: NewSet()}
	t.epoch.Store(ep)
	return ep, nil
}

// End closes the epoch and stops recording. It is idempotent.
func (e *Epoch) End() {
	if e.ended.Swap(true) {
		return
	}
	e.t.epoch.CompareAndSwap(e, nil)
}

// Protected reports whether a writer recorded id (or Protect was called
// with it) since the epoch began.
func (e *Epoch) Protected(id cas.ID) bool { return e.set.Has(id) }

// Protect records ids as if a writer had stored them: DeleteUnless keeps
// them. Only the ids themselves are kept, not what a tree references.
func (e *Epoch) Protect(ids ...cas.ID) {
	for _, id := range ids {
		mu := e.t.stripe(id)
		mu.Lock()
		e.set.Add(id)
		mu.Unlock()
	}
}

// Recorded returns how many ids the epoch holds.
func (e *Epoch) Recorded() int { return e.set.Len() }

// Wait returns once every session that entered before the epoch began has
// left, or when ctx ends. Their objects may have been stored before the
// epoch could record them; once they have left, their roots are committed
// and the collection's roots include them.
func (e *Epoch) Wait(ctx context.Context) error {
	for {
		e.t.mu.Lock()
		busy := false
		for g, n := range e.t.open {
			if g < e.gen && n > 0 {
				busy = true
				break
			}
		}
		ch := e.t.changed
		e.t.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for write sessions: %w", ctx.Err())
		}
	}
}

// Deps returns the deps of every open session, deduplicated.
func (e *Epoch) Deps() []cas.ID {
	e.t.mu.Lock()
	defer e.t.mu.Unlock()
	seen := map[cas.ID]struct{}{}
	var out []cas.ID
	for s := range e.t.deps {
		for _, id := range s.deps {
			if _, ok := seen[id]; !ok {
				seen[id] = struct{}{}
				out = append(out, id)
			}
		}
	}
	return out
}
