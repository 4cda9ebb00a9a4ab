package cas

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
)

// Batcher is an optional Store role: puts that become durable and visible
// together, so a store can pay for durability once per batch instead of once
// per object. Importers of many small files want it; everything else keeps
// using Put. Take it with NewBatch, which falls back to plain Puts.
type Batcher interface {
	// NewBatch starts an empty batch. It holds no resources until its first
	// Put.
	NewBatch() Batch
}

// Batch collects objects and publishes them with one Commit.
//
// Put hashes while writing, like Putter.Put, and returns the id and size,
// but the object is neither durable nor visible (Has, Stat, Get and Walk do
// not see it) until Commit returns nil. created reports whether the object
// is new to the store: not already stored and not already put in this batch,
// so within one batch it is true once per id however many goroutines put the
// same bytes. It is decided at Put time: a writer outside the batch that
// stores the same object before Commit may also report created. An object
// that is already stored is left untouched and is durable when Put returns,
// as with Putter.Put. A failed Put (reader error, cancelled context) leaves
// nothing of that object and does not spoil the batch.
//
// Commit makes every object durable, then publishes them. Publication is per
// object: a crash or a failure during Commit may publish a subset, each
// object whole and matching its id, never a partial one. What Commit
// published before failing stays (it is valid content; GC removes it if
// nothing refers to it). Abort, or a Commit that fails, removes the batch's
// unpublished data.
//
// Exactly one of Commit and Abort ends a batch. Abort after Commit (even a
// failed one) or after Abort is a no-op, so
//
//	b := cas.NewBatch(store)
//	defer b.Abort()
//	... b.Put ...
//	return b.Commit(ctx)
//
// is the idiom. Put and Commit after the end fail with ErrFailedPrecondition.
//
// Concurrency: Put is safe from many goroutines at once; Commit and Abort
// must not run concurrently with Put or with each other (a Put that races
// with them anyway fails or is discarded, it never leaks data).
type Batch interface {
	Putter
	// Commit makes the batch's objects durable and visible, and ends the
	// batch. A cancelled context stops it between objects.
	Commit(ctx context.Context) error
	// Abort discards the batch's unpublished objects and ends the batch.
	Abort()
}

// NewBatch returns s's own batch when s implements Batcher. Otherwise it
// returns a batch that forwards every Put to s.Put: each object is then
// durable and visible as soon as its Put returns, Commit only ends the batch,
// and Abort removes nothing (what was put is valid content for GC to judge).
// Callers that need "nothing visible before Commit" must require Batcher
// instead.
func NewBatch(s Putter) Batch {
	if b, ok := s.(Batcher); ok {
		return b.NewBatch()
	}
	return &putBatch{s: s}
}

// putBatch is the fallback batch: Put is Putter.Put, with the end of the
// batch enforced so that misuse fails the same way as with real batches.
type putBatch struct {
	s    Putter
	mu   sync.Mutex
	done bool
}

func (b *putBatch) Put(ctx context.Context, r io.Reader) (Info, bool, error) {
	b.mu.Lock()
	done := b.done
	b.mu.Unlock()
	if done {
		return Info{}, false, fmt.Errorf("batch put: batch already ended: %w", ErrFailedPrecondition)
	}
	return b.s.Put(ctx, r)
}

func (b *putBatch) Commit(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return fmt.Errorf("batch commit: batch already ended: %w", ErrFailedPrecondition)
	}
	b.done = true
	// Everything is durable already, but a caller that cancelled must not
	// take the batch for committed.
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("batch commit: %w", err)
	}
	return nil
}

func (b *putBatch) Abort() {
	b.mu.Lock()
	b.done = true
	b.mu.Unlock()
}

// Adopter is an optional Batch role: storing a file by taking over its
// inode instead of copying its bytes, for content that its owner hands to
// the store (a seal of an attempt that is released with it: nobody writes
// its upper directory again).
//
// Adopt reads r, which must yield exactly f's content (the caller may wrap
// f's reads to count or check them), to its end and hashes it. If the
// object is new, the store may make f's inode the object: f's file then
// becomes the store's (its owner and group change, which clears set-id
// bits and file capabilities) and read-only (mode 0444) and shares its
// inode with the object, so
// the caller must never write it again, nor let anyone (a caller that
// goes on using the file must first replace it with a copy). A store that
// cannot (another file system) stores a copy instead, as Put does. The
// result is as Put's; the object is durable and visible once Commit
// returns nil. Adopt fails with errdefs' ErrConflict semantics
// (ErrFailedPrecondition here) if f changed while it was read.
type Adopter interface {
	Adopt(ctx context.Context, f *os.File, r io.Reader) (Info, bool, error)
}

// Adopt stores the content of f that r reads through b's Adopter role, or
// with b.Put when b has none.
func Adopt(ctx context.Context, b Batch, f *os.File, r io.Reader) (Info, bool, error) {
	if a, ok := b.(Adopter); ok {
		return a.Adopt(ctx, f, r)
	}
	return b.Put(ctx, r)
}
