// Package tier puts a local store in front of a remote one (cas/s3): the
// local store becomes a verified cache, and what is written goes through to
// the remote.
//
// Reads: Get, Has and Stat answer from the local store when it holds the
// object. A Get that misses fetches the object from the remote into the
// local store: the remote's reader verifies BLAKE3 at EOF, and the local
// Put stores nothing from a reader that fails, so an object is verified
// before it is used or stored. A fetch whose bytes do not match is repeated
// once; a second mismatch is cas.ErrCorrupt. Transport failures mid-body
// (resets, truncation) are retried up to three times; what is left is
// errdefs.ErrUnavailable. Concurrent fetches of one object share one
// transfer.
//
// Writes (Put, batches): the object is stored locally first, then made
// durable in the remote before the call returns (sync durability): a seal
// is answered only once its new objects are in the remote. Has and Stat
// count as references (a writer that finds an object references it): a
// cached object not known to be in the remote is made durable there before
// they answer. Objects the
// local store reports as new are uploaded without asking; objects it
// already held are uploaded only if the remote lacks them (an earlier seal
// may have failed after its local commit). The tier remembers which objects
// it knows to be remote, so repeated writes cost no requests.
//
// Walk and Delete act on the local cache only: the local GC and cache
// eviction remove local copies, never remote ones (the remote's GC is
// separate).
//
// Path names an object's local file (FUSE passthrough) without fetching
// it; fusefs calls Get (which fetches) before it opens a blob.
package tier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/errdefs"
)

// Remote is what the tier needs of the remote store (cas/s3 implements it).
type Remote interface {
	cas.Getter
	cas.Haser
	cas.Statter
	// Upload stores objects whose ids the caller vouches for (it verifies
	// them anyway).
	Upload(ctx context.Context, objs []s3store.Source) error
}

// Options configures New.
type Options struct {
	Local  *local.Store
	Remote Remote
	Logger *slog.Logger
	// CacheSize bounds the local store's bytes (LRU, see cache.go); zero
	// leaves it unbounded. New counts what the store holds first.
	CacheSize int64
	// Pinned returns the roots whose cached objects eviction keeps (the
	// base roots of live attempts).
	Pinned func(context.Context) ([]cas.ID, error)
	// QueueDir, if set, makes durability async: writes return once their
	// objects are committed locally and named in the upload queue kept in
	// this directory, which an uploader drains (queue.go). Close stops it.
	QueueDir string
}

// Stats counts the tier's traffic, for tests, status and metrics.
type Stats struct {
	// Fetches are objects fetched from the remote into the cache, with
	// their bytes; FetchRetries the transfers repeated after a mismatch or
	// a transport failure; Corrupt the fetches that failed verification
	// twice.
	Fetches, FetchedBytes, FetchRetries, Corrupt atomic.Int64
	// Uploads are objects made durable in the remote, with their bytes;
	// RemoteChecks the existence checks of objects the local store held.
	Uploads, UploadedBytes, RemoteChecks atomic.Int64
	// Evictions are objects removed from the cache by its bound.
	Evictions, EvictedBytes atomic.Int64
}

// Store is the tiered cas.Store.
type Store struct {
	local  *local.Store
	remote Remote
	log    *slog.Logger

	mu       sync.Mutex
	known    map[cas.ID]struct{} // objects known to be in the remote
	inflight map[cas.ID]*fetch
	cache    *cacheState // nil: unbounded

	pinnedRoots func(context.Context) ([]cas.ID, error)
	evicting    sync.Mutex
	queue       *queue // nil: sync durability
	drainMu     sync.Mutex

	stats Stats
}

type fetch struct {
	done chan struct{}
	info cas.Info
	err  error
}

var (
	_ cas.Store   = (*Store)(nil)
	_ cas.Batcher = (*Store)(nil)
)

// New returns the tier over opts.Local and opts.Remote.
func New(opts Options) (*Store, error) {
	if opts.Local == nil || opts.Remote == nil {
		return nil, fmt.Errorf("tier: local and remote stores are required: %w", cas.ErrInvalidArgument)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Store{local: opts.Local, remote: opts.Remote, log: log, pinnedRoots: opts.Pinned,
		known: map[cas.ID]struct{}{}, inflight: map[cas.ID]*fetch{}}
	if opts.CacheSize > 0 {
		t.cache = newCache(opts.CacheSize)
		if err := t.seedCache(context.Background(), false); err != nil {
			return nil, fmt.Errorf("tier: count the cache: %w", err)
		}
	}
	if opts.QueueDir != "" {
		q, err := openQueue(opts.QueueDir)
		if err != nil {
			return nil, fmt.Errorf("tier: %w", err)
		}
		t.queue = q
		t.startUploader()
	}
	return t, nil
}

// Stats returns the tier's counters.
func (t *Store) Stats() *Stats { return &t.stats }

// Local is the cache.
func (t *Store) Local() *local.Store { return t.local }

// Path implements fusefs.PathStore: the cache's file of id (which may not
// exist before a Get fetched it).
func (t *Store) Path(id cas.ID) string { return t.local.Path(id) }

// Get implements cas.Getter, fetching a missing object into the cache.
// The cache file is opened before the fetch counts against the cache
// bound, so an eviction it causes cannot take the object from the reader.
func (t *Store) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	rc, err := t.local.Get(ctx, id)
	if !errors.Is(err, cas.ErrNotFound) {
		if err == nil && t.cache != nil {
			t.mu.Lock()
			if e, ok := t.cache.elems[id]; ok {
				t.cache.order.MoveToFront(e)
			}
			t.mu.Unlock()
		}
		return rc, err
	}
	info, err := t.fetchShared(ctx, id)
	if err != nil {
		return nil, err
	}
	if rc, err = t.local.Get(ctx, id); err != nil {
		return nil, err
	}
	t.touch(ctx, id, info.Size)
	return rc, nil
}

// Fetch makes sure the cache holds id, fetching it from the remote if
// needed.
func (t *Store) Fetch(ctx context.Context, id cas.ID) error {
	info, err := t.fetchShared(ctx, id)
	if err == nil {
		t.touch(ctx, id, info.Size)
	}
	return err
}

// fetchShared fetches id unless the cache holds it; concurrent callers
// share one transfer.
func (t *Store) fetchShared(ctx context.Context, id cas.ID) (cas.Info, error) {
	if info, err := t.local.Stat(ctx, id); !errors.Is(err, cas.ErrNotFound) {
		return info, err
	}
	t.mu.Lock()
	f, ok := t.inflight[id]
	if !ok {
		f = &fetch{done: make(chan struct{})}
		t.inflight[id] = f
		t.mu.Unlock()
		// The transfer belongs to every waiter: one caller giving up must
		// not fail the others.
		f.info, f.err = t.fetch(context.WithoutCancel(ctx), id)
		t.mu.Lock()
		delete(t.inflight, id)
		t.mu.Unlock()
		close(f.done)
		return f.info, f.err
	}
	t.mu.Unlock()
	select {
	case <-f.done:
		return f.info, f.err
	case <-ctx.Done():
		return cas.Info{}, ctx.Err()
	}
}

// fetchAttempts bounds the transfers of one object: two may fail
// verification, the others only by transport.
const fetchAttempts = 4

func (t *Store) fetch(ctx context.Context, id cas.ID) (cas.Info, error) {
	corrupt := 0
	var last error
	for attempt := range fetchAttempts {
		if attempt > 0 {
			t.stats.FetchRetries.Add(1)
		}
		rc, err := t.remote.Get(ctx, id)
		if err != nil {
			// The remote's client retried already; not found is final.
			return cas.Info{}, fmt.Errorf("fetch %s: %w", id.Short(), err)
		}
		info, _, err := t.local.Put(ctx, rc)
		rc.Close()
		if err == nil {
			if info.ID != id { // the remote's reader verifies; never here
				return cas.Info{}, fmt.Errorf("fetch %s: got %s: %w", id.Short(), info.ID.Short(), cas.ErrCorrupt)
			}
			t.stats.Fetches.Add(1)
			t.stats.FetchedBytes.Add(info.Size)
			t.markKnown(id)
			return info, nil
		}
		last = err
		if errors.Is(err, cas.ErrCorrupt) {
			corrupt++
			t.log.Warn("fetched object does not match its id", "object", id.String(), "attempt", attempt+1)
			if corrupt == 2 {
				t.stats.Corrupt.Add(1)
				return cas.Info{}, fmt.Errorf("fetch %s: twice: %w", id.Short(), err)
			}
		} else {
			t.log.Warn("fetch failed", "object", id.String(), "attempt", attempt+1, "err", err)
		}
	}
	if errors.Is(last, cas.ErrCorrupt) {
		return cas.Info{}, fmt.Errorf("fetch %s: %w", id.Short(), last)
	}
	return cas.Info{}, fmt.Errorf("fetch %s: %v: %w", id.Short(), last, errdefs.ErrUnavailable)
}

func (t *Store) markKnown(ids ...cas.ID) {
	t.mu.Lock()
	for _, id := range ids {
		t.known[id] = struct{}{}
	}
	t.mu.Unlock()
}

// Forget drops ids from what the tier knows to be in the remote (the
// remote's GC deleted them): a later write of one uploads it again.
func (t *Store) Forget(ids []cas.ID) {
	t.mu.Lock()
	for _, id := range ids {
		delete(t.known, id)
	}
	t.mu.Unlock()
}

func (t *Store) isKnown(id cas.ID) bool {
	t.mu.Lock()
	_, ok := t.known[id]
	t.mu.Unlock()
	return ok
}

// Has implements cas.Haser: the cache, then the remote. A writer that
// finds an object with Has references it without a Put (dedup), so an
// object the cache holds but the remote is not known to hold is made
// durable there first, as a write of it would be.
func (t *Store) Has(ctx context.Context, id cas.ID) (bool, error) {
	_, err := t.Stat(ctx, id)
	if errors.Is(err, cas.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Stat implements cas.Statter: the cache, then the remote; like Has, it
// makes a cached object durable in the remote first.
func (t *Store) Stat(ctx context.Context, id cas.ID) (cas.Info, error) {
	info, err := t.local.Stat(ctx, id)
	if err == nil {
		if !t.isKnown(id) {
			if err := t.durable(ctx, []written{{info, false}}); err != nil {
				return cas.Info{}, err
			}
		}
		return info, nil
	}
	if !errors.Is(err, cas.ErrNotFound) {
		return info, err
	}
	return t.remote.Stat(ctx, id)
}

// Walk implements cas.Walker over the cache.
func (t *Store) Walk(ctx context.Context, fn func(cas.Info) error) error {
	return t.local.Walk(ctx, fn)
}

// Delete implements cas.Deleter on the cache: the remote keeps the object.
func (t *Store) Delete(ctx context.Context, id cas.ID) error {
	if err := t.local.Delete(ctx, id); err != nil {
		return err
	}
	if t.cache != nil {
		t.mu.Lock()
		t.cache.drop(id)
		t.mu.Unlock()
	}
	return nil
}

// Put implements cas.Putter: local, then durable in the remote.
func (t *Store) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	info, created, err := t.local.Put(ctx, r)
	if err != nil {
		return info, created, err
	}
	if err := t.durable(ctx, []written{{info, created}}); err != nil {
		return cas.Info{}, false, err
	}
	return info, created, nil
}

type written struct {
	cas.Info
	created bool
}

// durable makes the written objects durable in the remote, or (async)
// names them in the upload queue.
func (t *Store) durable(ctx context.Context, ws []written) error {
	if t.queue != nil {
		var ids []cas.ID
		seen := map[cas.ID]bool{}
		for _, w := range ws {
			if !seen[w.ID] && !t.isKnown(w.ID) {
				seen[w.ID] = true
				ids = append(ids, w.ID)
			}
		}
		if err := t.queue.add(ids); err != nil {
			return err
		}
		for _, w := range ws {
			t.touch(ctx, w.ID, w.Size)
		}
		return nil
	}
	var up []s3store.Source
	var check []written
	seen := map[cas.ID]bool{}
	for _, w := range ws {
		if seen[w.ID] || t.isKnown(w.ID) {
			continue
		}
		seen[w.ID] = true
		if w.created {
			up = append(up, t.source(w.Info))
		} else {
			check = append(check, w)
		}
	}
	if len(check) > 0 {
		has := make([]bool, len(check))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		for i, w := range check {
			g.Go(func() error {
				t.stats.RemoteChecks.Add(1)
				var err error
				has[i], err = t.remote.Has(gctx, w.ID)
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return fmt.Errorf("remote durability: %w", err)
		}
		for i, w := range check {
			if has[i] {
				t.markKnown(w.ID)
			} else {
				up = append(up, t.source(w.Info))
			}
		}
	}
	if len(up) == 0 {
		for _, w := range ws {
			t.touch(ctx, w.ID, w.Size)
		}
		return nil
	}
	if err := t.remote.Upload(ctx, up); err != nil {
		return fmt.Errorf("remote durability: %w", err)
	}
	for _, s := range up {
		t.stats.Uploads.Add(1)
		t.stats.UploadedBytes.Add(s.Size)
		t.markKnown(s.ID)
	}
	// Counted in the cache once durable remotely: only then may eviction
	// take them without asking.
	for _, w := range ws {
		t.touch(ctx, w.ID, w.Size)
	}
	return nil
}

func (t *Store) source(info cas.Info) s3store.Source {
	return s3store.Source{Info: info, Open: func() (io.ReadSeekCloser, error) {
		return os.Open(t.local.Path(info.ID))
	}}
}

// NewBatch implements cas.Batcher: the cache's batch, and at Commit the
// batch's objects made durable in the remote (packed together).
func (t *Store) NewBatch() cas.Batch {
	return &batch{t: t, b: t.local.NewBatch()}
}

type batch struct {
	t  *Store
	b  cas.Batch
	mu sync.Mutex
	ws []written
}

func (b *batch) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	info, created, err := b.b.Put(ctx, r)
	if err == nil {
		b.mu.Lock()
		b.ws = append(b.ws, written{info, created})
		b.mu.Unlock()
	}
	return info, created, err
}

// Adopt implements cas.Adopter with the cache's batch.
func (b *batch) Adopt(ctx context.Context, f *os.File, r io.Reader) (cas.Info, bool, error) {
	info, created, err := cas.Adopt(ctx, b.b, f, r)
	if err == nil {
		b.mu.Lock()
		b.ws = append(b.ws, written{info, created})
		b.mu.Unlock()
	}
	return info, created, err
}

func (b *batch) Commit(ctx context.Context) error {
	if err := b.b.Commit(ctx); err != nil {
		return err
	}
	b.mu.Lock()
	ws := b.ws
	b.ws = nil
	b.mu.Unlock()
	return b.t.durable(ctx, ws)
}

func (b *batch) Abort() { b.b.Abort() }
