package ingest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/esf-dev/esf/cas"
)

// Batches are committed when they reach any of these bounds (the store
// asks for short-lived batches) and when the import ends.
const (
	batchMaxObjects = 4096
	batchMaxBytes   = 512 << 20
	batchMaxAge     = 2 * time.Second
)

// objects is how one import writes to the store.
//
// It asks before it writes: content whose id is known (small files, trees)
// is put only when Has says the store lacks it, so a re-import writes
// nothing. And it writes through cas batches (cas.NewBatch), so a store
// that can group commits (the disk store: one syncfs per batch instead of
// one fsync per object) pays durability once per batch; other stores get
// plain Puts. Nothing an import returns refers to an uncommitted object:
// finish and commit publish the last batch, and abort drops it on failure
// (objects of batches committed earlier stay, valid and unreferenced, for
// GC).
//
// put is safe for concurrent use; a batch rotation waits for the Puts in
// flight (Batch.Commit must not overlap them).
type objects struct {
	st Store

	mu      sync.RWMutex
	batch   cas.Batch
	started time.Time // of batch, under mu
	count   atomic.Int64
	size    atomic.Int64

	newObjects atomic.Int64
	newBytes   atomic.Int64
}

func newObjects(st Store) *objects {
	return &objects{st: st, batch: cas.NewBatch(st), started: time.Now()}
}

// Put implements cas.Putter for Builder.Write, which hands over trees:
// small, read whole, stored only when missing.
func (o *objects) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	if ir, ok := r.(cas.IdentifiedReader); ok {
		// A huge tree, streamed: ask first, then stream it in.
		info := cas.Info{ID: ir.ContentID(), Size: ir.ContentSize()}
		if has, err := o.st.Has(ctx, info.ID); err != nil || has {
			return info, false, err
		}
		return o.put(ctx, ir)
	}
	if w, ok := r.(interface{ Bytes() []byte }); ok {
		// The Builder's own bytes: a huge directory's tree is not copied.
		b := w.Bytes()
		return o.putBytes(ctx, b, cas.Sum(b))
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return cas.Info{}, false, err
	}
	return o.putBytes(ctx, b, cas.Sum(b))
}

// putBytes stores b, whose id the caller computed, unless it is stored.
func (o *objects) putBytes(ctx context.Context, b []byte, id cas.ID) (cas.Info, bool, error) {
	info := cas.Info{ID: id, Size: int64(len(b))}
	has, err := o.st.Has(ctx, id)
	if err != nil || has {
		return info, false, err
	}
	got, created, err := o.put(ctx, bytes.NewReader(b))
	if err != nil {
		return cas.Info{}, false, err
	}
	if got.ID != id {
		return cas.Info{}, false, fmt.Errorf("store put %s returned id %s: %w", id, got.ID, cas.ErrCorrupt)
	}
	return got, created, nil
}

// put stores r's bytes in the current batch, committing it once full.
func (o *objects) put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	return o.store(ctx, func(b cas.Batch) (cas.Info, bool, error) { return b.Put(ctx, r) })
}

// adopt stores f, whose content r reads, with cas.Adopt in the current
// batch.
func (o *objects) adopt(ctx context.Context, f *os.File, r io.Reader) (cas.Info, bool, error) {
	return o.store(ctx, func(b cas.Batch) (cas.Info, bool, error) { return cas.Adopt(ctx, b, f, r) })
}

func (o *objects) store(ctx context.Context, put func(cas.Batch) (cas.Info, bool, error)) (cas.Info, bool, error) {
	o.mu.RLock()
	info, created, err := put(o.batch)
	full := o.count.Add(1) >= batchMaxObjects || o.size.Add(info.Size) >= batchMaxBytes ||
		time.Since(o.started) >= batchMaxAge
	o.mu.RUnlock()
	if err != nil {
		return cas.Info{}, false, err
	}
	if created {
		o.newObjects.Add(1)
		o.newBytes.Add(info.Size)
	}
	if full {
		if err := o.rotate(ctx); err != nil {
			return cas.Info{}, false, err
		}
	}
	return info, created, nil
}

// rotate commits the current batch if it is still full (another put may
// have rotated it meanwhile) and starts the next.
func (o *objects) rotate(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.count.Load() < batchMaxObjects && o.size.Load() < batchMaxBytes && time.Since(o.started) < batchMaxAge {
		return nil
	}
	return o.commitLocked(ctx)
}

func (o *objects) commitLocked(ctx context.Context) error {
	err := o.batch.Commit(ctx)
	o.batch, o.started = cas.NewBatch(o.st), time.Now()
	o.count.Store(0)
	o.size.Store(0)
	if err != nil {
		return fmt.Errorf("commit objects: %w", err)
	}
	return nil
}

// commit publishes what is pending and records the import's counts in s.
func (o *objects) commit(ctx context.Context, s *Stats) error {
	o.mu.Lock()
	err := o.commitLocked(ctx)
	o.mu.Unlock()
	s.NewObjects, s.NewBytes = o.newObjects.Load(), o.newBytes.Load()
	return err
}

// abort drops the pending batch; after commit it drops nothing.
func (o *objects) abort() {
	o.mu.Lock()
	o.batch.Abort()
	o.mu.Unlock()
}

// finish writes b's trees, commits everything and records the counts.
func (o *objects) finish(ctx context.Context, b *cas.Builder, s *Stats) (cas.ID, error) {
	id, err := b.Write(ctx, o)
	if err != nil {
		return cas.ZeroID, fmt.Errorf("write trees: %w", err)
	}
	if err := o.commit(ctx, s); err != nil {
		return cas.ZeroID, err
	}
	return id, nil
}
