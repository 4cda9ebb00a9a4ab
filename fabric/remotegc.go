package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/gc"
	"github.com/esf-dev/esf/journal"
)

// The remote collection's protocol with the writers of every worker
// (docs/s3.md, "Collecting the bucket").
//
// The local tracker (package gc) protects this process's writers from a
// collection; a collection run by another worker cannot see them. So the
// shared journal holds one record, cfg/remote-gc: a generation that every
// remote collection advances when it starts, and whether one is running.
//
//   - A collection commits {gen+1, active} before it marks, marks what the
//     journal (every worker's graph) reaches at a snapshot after that
//     commit, deletes, then commits {gen+1, inactive}.
//   - A write session (seal, import, merge, create group, evaluate with
//     evidence) records every id it stores or finds (gc.Recorder) and the
//     record as it last saw it. Its commit, in the same journal
//     transaction, reads the record. If a collection is running, the
//     commit waits for its end. If a collection ran since the session
//     began (another generation, or one active at its start), it makes
//     every recorded object durable again: forgets what it believed to be
//     in the bucket and checks each object there, uploading from its cache
//     what a collection deleted. Then it commits, the transaction's read
//     of the record guaranteeing that no collection started in between.
//     An object the session found in the bucket only (an import's or a
//     seal's dedup against content it never held) and that was deleted
//     fails the write, unavailable: nothing was committed, and the retry
//     stores the object again.
//
// So a committed node's content is in the bucket: what its session wrote
// or found was checked after the last collection that could delete it and
// before any later one started; what it reuses by id without a store call
// (a seal's unchanged directories, a merge's heads, a fork's parent) is
// reachable from nodes that the commit checks are live (a leased base, an
// unpruned head), so they were live at every earlier mark; and every later
// collection marks the node itself. A collection whose worker died while
// active holds no writer back: its registration is gone, and the writers
// re-check as after any collection.

// remoteGCRecord is the journal key of the remote collection's record:
// configuration the workers share, not a graph record.
var remoteGCRecord = []byte("cfg/remote-gc")

type remoteGCState struct {
	Gen    uint64 `json:"gen"`
	Active bool   `json:"active,omitempty"`
	// Owner is the worker running it, OwnerStarted its registration's
	// start (a restarted worker of the same id is another owner).
	Owner        string    `json:"owner,omitempty"`
	OwnerStarted time.Time `json:"owner_started,omitzero"`
}

// remoteGC is a fabric's view of the record.
type remoteGC struct {
	mu      sync.Mutex
	seen    remoteGCState // the record as last read
	running bool          // this process runs a remote collection
	loaded  atomic.Bool   // seen was read from the journal once
	// rechecked counts objects made durable again after a collection
	// overlapped their session (tests).
	rechecked atomic.Int64
}

// remoteSession is a write session's part of the protocol.
type remoteSession struct {
	rec *gc.Recorder
	// gen and active: the record as the session last knew it.
	gen    uint64
	active bool
}

type remoteSessionKey struct{}

// remoteSession returns ctx recording the session's ids for the remote
// protocol (unchanged without a remote store, or inside a session).
func (f *Fabric) remoteSession(ctx context.Context) context.Context {
	if f.tier == nil || ctx.Value(remoteSessionKey{}) != nil {
		return ctx
	}
	ctx, rec := gc.WithRecorder(ctx)
	if !f.rgc.loaded.Load() {
		// Once per process, so that its first write does not take every
		// past collection for one that overlapped it. A failed read
		// leaves the zero view, which is only conservative.
		var st remoteGCState
		if f.journal.View(ctx, func(r journal.Reader) (err error) {
			st, err = readRemoteGC(r)
			return err
		}) == nil {
			f.sawRemoteGC(st)
			f.rgc.loaded.Store(true)
		}
	}
	f.rgc.mu.Lock()
	// What this process last saw can only be older than the record, never
	// newer: a stale view makes the commit check again, never skip it.
	s := &remoteSession{rec: rec, gen: f.rgc.seen.Gen, active: f.rgc.seen.Active || f.rgc.running}
	f.rgc.mu.Unlock()
	return context.WithValue(ctx, remoteSessionKey{}, s)
}

// errRemoteGCOverlap: a remote collection ran during the session, or runs.
type errRemoteGCOverlap struct{ state remoteGCState }

func (e *errRemoteGCOverlap) Error() string {
	return fmt.Sprintf("a remote collection (generation %d) overlapped the write", e.state.Gen)
}

func readRemoteGC(r journal.Reader) (remoteGCState, error) {
	var st remoteGCState
	b, err := r.Get(remoteGCRecord)
	if errors.Is(err, journal.ErrNotFound) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %v: %w", remoteGCRecord, err, journal.ErrCorrupt)
	}
	return st, nil
}

func (f *Fabric) sawRemoteGC(st remoteGCState) {
	f.rgc.mu.Lock()
	if st.Gen >= f.rgc.seen.Gen {
		f.rgc.seen = st
	}
	f.rgc.mu.Unlock()
}

// checkRemoteGC runs in a write session's commit transaction: nil if no
// collection ran since the session last checked its objects.
func (f *Fabric) checkRemoteGC(tx journal.Tx, s *remoteSession) error {
	if s.rec.Len() == 0 {
		return nil // it references content by id only: see above
	}
	st, err := readRemoteGC(tx)
	if err != nil {
		return err
	}
	f.sawRemoteGC(st)
	if st.Gen != s.gen || s.active || st.Active {
		return &errRemoteGCOverlap{st}
	}
	return nil
}

// ownerAlive reports whether the collection st says is active still runs.
func (f *Fabric) ownerAlive(ctx context.Context, st remoteGCState) (bool, error) {
	if !st.Active {
		return false, nil
	}
	if f.cluster == nil {
		f.rgc.mu.Lock()
		defer f.rgc.mu.Unlock()
		return f.rgc.running, nil
	}
	ws, err := f.cluster.Store.Workers(ctx)
	if err != nil {
		return false, err
	}
	for _, w := range ws {
		if w.ID == st.Owner && w.Started.Equal(st.OwnerStarted) {
			return true, nil
		}
	}
	return false, nil
}

// afterRemoteGC waits until no remote collection runs, then makes the
// session's objects durable in the bucket again.
func (f *Fabric) afterRemoteGC(ctx context.Context, s *remoteSession, st remoteGCState) error {
	for {
		alive, err := f.ownerAlive(ctx, st)
		if err != nil {
			return err
		}
		if !alive {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if err := f.journal.View(ctx, func(r journal.Reader) (err error) {
			st, err = readRemoteGC(r)
			return err
		}); err != nil {
			return err
		}
		f.sawRemoteGC(st)
	}
	ids := s.rec.IDs()
	f.tier.Forget(ids)
	// Packs the collection deleted or rewrote are still in the remote
	// store's index of them: read the indexes again first.
	if r, ok := f.opts.Remote.(interface{ Reload(context.Context) error }); ok {
		if err := r.Reload(ctx); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, id := range ids {
		g.Go(func() error {
			// The cache holds what the session stored; Stat makes a cached
			// object not known to be remote durable there (uploading it if
			// the bucket lacks it). An object the session only found in the
			// bucket, and that a collection deleted, is gone.
			if _, err := f.tier.Stat(gctx, id); errors.Is(err, journal.ErrNotFound) {
				return fmt.Errorf("object %s, found in the bucket, was deleted by a remote collection during the write: retry it: %w",
					id.Short(), errdefs.ErrUnavailable)
			} else if err != nil {
				return fmt.Errorf("object %s: %w", id.Short(), err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	f.rgc.rechecked.Add(int64(len(ids)))
	s.gen, s.active = st.Gen, false
	return nil
}

// beginRemoteGC advances the record's generation and marks it active, as
// this worker's: refused while another live worker's collection runs.
func (f *Fabric) beginRemoteGC(ctx context.Context) (remoteGCState, error) {
	var owner remoteGCState
	owner.Owner = f.worker
	if f.cluster != nil {
		ws, err := f.cluster.Store.Workers(ctx)
		if err != nil {
			return owner, err
		}
		for _, w := range ws {
			if w.ID == f.worker {
				owner.OwnerStarted = w.Started
			}
		}
		if owner.OwnerStarted.IsZero() {
			return owner, fmt.Errorf("this worker's registration is lost: %w", journal.ErrFailedPrecondition)
		}
	}
	f.rgc.mu.Lock()
	f.rgc.running = true
	f.rgc.mu.Unlock()
	var st remoteGCState
	err := f.journal.Update(ctx, func(tx journal.Tx) error {
		cur, err := readRemoteGC(tx)
		if err != nil {
			return err
		}
		if cur.Active && (cur.Owner != owner.Owner || !cur.OwnerStarted.Equal(owner.OwnerStarted)) {
			alive, err := f.ownerAlive(ctx, cur)
			if err != nil {
				return err
			}
			if alive {
				return fmt.Errorf("worker %s runs a remote collection: %w", cur.Owner, journal.ErrFailedPrecondition)
			}
		}
		st = owner
		st.Gen, st.Active = cur.Gen+1, true
		b, _ := json.Marshal(st)
		return tx.Put(remoteGCRecord, b)
	})
	if err != nil {
		f.rgc.mu.Lock()
		f.rgc.running = false
		f.rgc.mu.Unlock()
		return st, err
	}
	f.sawRemoteGC(st)
	return st, nil
}

// endRemoteGC marks the collection st ended.
func (f *Fabric) endRemoteGC(ctx context.Context, st remoteGCState) error {
	defer func() {
		f.rgc.mu.Lock()
		f.rgc.running = false
		f.rgc.mu.Unlock()
	}()
	return f.journal.Update(context.WithoutCancel(ctx), func(tx journal.Tx) error {
		cur, err := readRemoteGC(tx)
		if err != nil || cur.Gen != st.Gen {
			return err // a later collection took over: leave its record
		}
		cur.Active = false
		b, _ := json.Marshal(cur)
		if err := tx.Put(remoteGCRecord, b); err != nil {
			return err
		}
		f.sawRemoteGC(cur)
		return nil
	})
}
