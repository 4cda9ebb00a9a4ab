package fabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/ingest"
)

// countingStore is a cas.Store decorator that keeps the number and total
// size of stored objects current, so Status never walks the store.
//
// The tally starts with one walk (scan), run in the background from Open.
// While it runs, Puts and Deletes record their outcome per id in pending
// and the walk only adds ids nobody has recorded: whatever the interleaving
// of the walk with a Put or Delete of the same id, the id is counted once
// and with its final presence. After the walk, pending is folded into the
// counters and mutations update them directly.
//
// The tally is exact as long as every write to the store goes through this
// decorator (the daemon holds the state lock, so no other esfd writes).
type countingStore struct {
	cas.Store

	// deleteMu serializes Deletes and records of one id (striped by its
	// first byte, see stripe) so that two Deletes subtract it once (the
	// second one's Stat finds it gone). Different ids run in parallel (a
	// sweep's workers).
	deleteMu [64]sync.Mutex

	mu       sync.Mutex
	scanning bool
	pending  map[cas.ID]int64 // while scanning: size, or -1 for deleted
	objects  int64
	bytes    int64
	scanErr  error
	scanned  chan struct{} // closed when the walk ends
}

var (
	_ cas.Store   = (*countingStore)(nil)
	_ cas.Batcher = (*countingStore)(nil)

	_ cas.DeletionCounter = (*countingStore)(nil)
)

func newCountingStore(s cas.Store) *countingStore {
	return &countingStore{
		Store:    s,
		scanning: true,
		pending:  map[cas.ID]int64{},
		scanned:  make(chan struct{}),
	}
}

// Unwrap returns the decorated store.
func (c *countingStore) Unwrap() cas.Store { return c.Store }

// Deletions implements cas.DeletionCounter for the decorated store (its
// Deletes all reach it).
func (c *countingStore) Deletions() (uint64, bool) {
	if dc, ok := c.Store.(cas.DeletionCounter); ok {
		return dc.Deletions()
	}
	return 0, false
}

// stripe is the lock that orders Deletes and records of id.
func (c *countingStore) stripe(id cas.ID) *sync.Mutex {
	return &c.deleteMu[int(id[0])%len(c.deleteMu)]
}

// record counts a Put that created id or a Delete that removed it; the
// caller holds id's stripe. While the walk runs, the last record of an id
// is taken as its state, so it records what the store holds right now
// rather than what this call did: a Put's create and a Delete of the same
// id may reach here in the other order than they reached the store.
func (c *countingStore) record(id cas.ID, size int64, added bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.scanning {
		c.pending[id] = -1
		if info, err := c.Store.Stat(context.Background(), id); err == nil {
			c.pending[id] = info.Size
		}
		return
	}
	if added {
		c.objects++
		c.bytes += size
	} else {
		c.objects--
		c.bytes -= size
	}
}

func (c *countingStore) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	info, created, err := c.Store.Put(ctx, r)
	if err == nil && created {
		mu := c.stripe(info.ID)
		mu.Lock()
		c.record(info.ID, info.Size, true)
		mu.Unlock()
	}
	return info, created, err
}

func (c *countingStore) Delete(ctx context.Context, id cas.ID) error {
	mu := c.stripe(id)
	mu.Lock()
	defer mu.Unlock()
	info, err := c.Store.Stat(ctx, id)
	if err != nil {
		if isNotFound(err) {
			return nil // already gone: nothing to subtract, nothing to do
		}
		return err
	}
	if err := c.Store.Delete(ctx, id); err != nil {
		return err
	}
	c.record(id, info.Size, false)
	return nil
}

// NewBatch implements cas.Batcher with the decorated store's batches (or
// plain Puts when it has none), counting what a batch created once it is
// committed, since only then is it stored.
//
// Two inexactnesses are accepted: a batch and a concurrent writer outside
// it that store the same new object may both report it created and both
// count it; and a seal's batch handed to a cas.Deferral is counted at its
// Commit, before the seal's transaction decides whether it is published.
// The tally is for display; a restart recounts.
func (c *countingStore) NewBatch() cas.Batch {
	return &countingBatch{c: c, b: cas.NewBatch(c.Store)}
}

type countingBatch struct {
	c       *countingStore
	b       cas.Batch
	mu      sync.Mutex
	created []cas.Info
}

func (b *countingBatch) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	info, created, err := b.b.Put(ctx, r)
	if err == nil && created {
		b.mu.Lock()
		b.created = append(b.created, info)
		b.mu.Unlock()
	}
	return info, created, err
}

// Adopt implements cas.Adopter with the decorated store's batch.
func (b *countingBatch) Adopt(ctx context.Context, f *os.File, r io.Reader) (cas.Info, bool, error) {
	info, created, err := cas.Adopt(ctx, b.b, f, r)
	if err == nil && created {
		b.mu.Lock()
		b.created = append(b.created, info)
		b.mu.Unlock()
	}
	return info, created, err
}

func (b *countingBatch) Commit(ctx context.Context) error {
	err := b.b.Commit(ctx)
	b.mu.Lock()
	created := b.created
	b.created = nil
	b.mu.Unlock()
	for _, info := range created {
		if err != nil {
			// A failed commit may have published a subset: count what is
			// there. Use a fresh context: ctx may be why it failed.
			if ok, herr := b.c.Store.Has(context.WithoutCancel(ctx), info.ID); herr != nil || !ok {
				continue
			}
		}
		mu := b.c.stripe(info.ID)
		mu.Lock()
		b.c.record(info.ID, info.Size, true)
		mu.Unlock()
	}
	return err
}

func (b *countingBatch) Abort() {
	b.b.Abort()
	b.mu.Lock()
	b.created = nil
	b.mu.Unlock()
}

// scan walks the store once and publishes the tally. It runs on its own
// goroutine (started by Open, waited for by Close).
func (c *countingStore) scan(ctx context.Context, log *slog.Logger) {
	start := time.Now()
	err := c.Store.Walk(ctx, func(info cas.Info) error {
		c.mu.Lock()
		if _, seen := c.pending[info.ID]; !seen {
			c.pending[info.ID] = info.Size
		}
		c.mu.Unlock()
		return nil
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.scanErr = fmt.Errorf("count objects: %w", err)
		if errors.Is(err, context.Canceled) {
			log.Debug("object tally stopped by close")
		} else {
			log.Error("object tally failed", "err", err)
		}
	} else {
		for _, size := range c.pending {
			if size >= 0 {
				c.objects++
				c.bytes += size
			}
		}
		log.Info("object tally ready", "objects", c.objects, "bytes", c.bytes,
			"ms", time.Since(start).Milliseconds())
	}
	c.scanning = false
	c.pending = nil
	close(c.scanned)
}

// tally returns the object count and bytes, waiting for the initial walk.
func (c *countingStore) tally(ctx context.Context) (objects, bytes int64, err error) {
	select {
	case <-c.scanned:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.scanErr != nil {
		return 0, 0, c.scanErr
	}
	return c.objects, c.bytes, nil
}

func isNotFound(err error) bool { return errors.Is(err, cas.ErrNotFound) }

// ImportSource names what to import: exactly one of Path or Tar.
type ImportSource struct {
	// Path is an absolute path on the daemon's host: a directory, a tar
	// (plain, gzip, zstd), an OCI image layout or an OCI/docker archive.
	Path string
	// Tar is a tar stream (plain, gzip, zstd), read to its end.
	Tar io.Reader
}

// Import stores src and returns its root tree. Importing content that is
// already stored writes nothing (Result.NewObjects is 0).
func (f *Fabric) Import(ctx context.Context, src ImportSource) (ingest.Result, error) {
	// A GC session for the import itself; the root it returns is pinned
	// only once a group names it (CreateGroupFrom does both in one
	// session; CreateGroup of the root later checks it is still whole).
	leave := f.store.Enter()
	defer leave()
	return f.importInSession(ctx, src)
}

// importInSession is Import inside the caller's GC session.
func (f *Fabric) importInSession(ctx context.Context, src ImportSource) (ingest.Result, error) {
	opts := ingest.Options{Logger: f.log.With("op", "import"), TempDir: f.tmpDir}
	switch {
	case src.Path != "" && src.Tar != nil:
		return ingest.Result{}, fmt.Errorf("import: both a path and a stream: %w", errdefs.ErrInvalidArgument)
	case src.Tar != nil:
		res, err := ingest.Tar(ctx, f.store, src.Tar, opts)
		if err != nil {
			return res, fmt.Errorf("import tar stream: %w", err)
		}
		f.log.Info("imported", "source", "tar stream", "root_id", res.Root, "files", res.Files, "new_objects", res.NewObjects)
		f.returnMemory(res.Stats)
		return res, nil
	case src.Path != "":
		if !filepath.IsAbs(src.Path) {
			return ingest.Result{}, fmt.Errorf("import %q: not an absolute path: %w", src.Path, errdefs.ErrInvalidArgument)
		}
		opts.StatCache = f.statCache
		res, err := ingest.Path(ctx, f.store, src.Path, opts)
		if err != nil {
			return res, fmt.Errorf("import %s: %w", src.Path, err)
		}
		f.log.Info("imported", "source", src.Path, "root_id", res.Root, "files", res.Files, "new_objects", res.NewObjects)
		f.returnMemory(res.Stats)
		return res, nil
	}
	return ingest.Result{}, fmt.Errorf("import: nothing to import: %w", errdefs.ErrInvalidArgument)
}

// ResolveRoot returns the root tree that id designates (see resolveRoot).
func (f *Fabric) ResolveRoot(ctx context.Context, id string) (cas.ID, error) {
	return f.resolveRoot(ctx, id)
}

// Fsck re-hashes every stored object. Bad objects are reported in the
// result (and logged), not returned as an error.
func (f *Fabric) Fsck(ctx context.Context) (cas.FsckResult, error) {
	res, err := cas.Fsck(ctx, f.store, func(id cas.ID, err error) {
		f.log.Error("fsck: bad object", "id", id, "err", err)
	})
	if err != nil {
		return res, fmt.Errorf("fsck: %w", err)
	}
	f.log.Info("fsck done", "checked", res.Checked, "bytes", res.Bytes, "bad", len(res.Bad))
	return res, nil
}
