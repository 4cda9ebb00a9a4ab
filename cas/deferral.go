package cas

import (
	"context"
	"errors"
	"sync"
)

// A Deferral takes over the durability of small batch commits for a caller
// that has a durable log of its own (fabric: the journal), so that one flush
// of that log makes both its own record and the batch's objects durable
// instead of one flush each.
//
// A store's batch that can (cas/local, for a batch small enough to hold in
// memory) finds the Deferral in the context of Commit (WithDeferral) and,
// instead of making its objects durable and publishing them, hands them to
// the Deferral (Take) and returns nil with nothing published: none of its
// objects is visible in the store yet. The caller then:
//
//  1. writes every object of Objects into its log (the redo record: id and
//     bytes) in the same transaction as whatever refers to them, and
//     commits it with one flush;
//  2. calls Publish, which makes the objects visible in the store with
//     nothing flushed (their redo record is durable);
//  3. before anything reads the store after a restart, rewrites from its
//     log every recorded object the store lacks or holds damaged (the
//     store's replay, e.g. local.Store.Redo);
//  4. retires the records once a flush of the store has made the published
//     objects durable by themselves (e.g. local.Store.Sync).
//
// If the log's transaction does not commit, the caller calls Abort
// instead of Publish; it must never Abort objects whose records may be
// durable (publish them: what a crash loses, step 3 rewrites).
//
// Stores that cannot defer ignore the Deferral and commit as usual.
type Deferral struct {
	mu      sync.Mutex
	ended   bool
	objects []DeferredObject
	size    int
	publish []func(context.Context) error
	abort   []func()
}

// DeferredObject is one object of a Deferral: its id and its bytes.
type DeferredObject struct {
	ID   ID
	Data []byte
}

// What one Deferral carries at most: its records go into one transaction
// of the caller's log, one value per object (journal.MaxValueSize).
const (
	DeferMaxObjects = 64
	DeferMaxBytes   = 1 << 20
)

type deferralKey struct{}

// WithDeferral returns ctx carrying d: the batch commits made with it
// may hand their objects to d.
func WithDeferral(ctx context.Context, d *Deferral) context.Context {
	return context.WithValue(ctx, deferralKey{}, d)
}

// DeferralFrom returns the Deferral ctx carries, or nil.
func DeferralFrom(ctx context.Context) *Deferral {
	d, _ := ctx.Value(deferralKey{}).(*Deferral)
	return d
}

// Take is called by a batch's Commit: it hands over objs, with the
// functions that publish them or drop them. It reports false, taking
// nothing, if d has ended or would carry more than its limits; the batch
// then commits on its own.
func (d *Deferral) Take(objs []DeferredObject, publish func(context.Context) error, abort func()) bool {
	size := 0
	for _, o := range objs {
		size += len(o.Data)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ended || len(d.objects)+len(objs) > DeferMaxObjects || d.size+size > DeferMaxBytes {
		return false
	}
	d.objects = append(d.objects, objs...)
	d.size += size
	d.publish = append(d.publish, publish)
	d.abort = append(d.abort, abort)
	return true
}

// Objects returns what d was handed: the records the caller must make
// durable before Publish. After Publish or Abort it is empty, and nothing
// more can be taken.
func (d *Deferral) Objects() []DeferredObject {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.objects
}

// end closes d and hands over its functions.
func (d *Deferral) end() ([]func(context.Context) error, []func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ended {
		return nil, nil
	}
	p, a := d.publish, d.abort
	d.ended, d.objects, d.publish, d.abort = true, nil, nil, nil
	return p, a
}

// Publish makes every object of d visible in its store. Call it only once
// their records are durable; it does not stop at ctx's end (what is
// committed must be published). Errors are joined; the objects of a
// failed publication are still in the records.
func (d *Deferral) Publish(ctx context.Context) error {
	publish, _ := d.end()
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for _, p := range publish {
		errs = append(errs, p(ctx))
	}
	return errors.Join(errs...)
}

// Abort drops every object of d: nothing of them is ever published. Call
// it only if their records cannot be durable.
func (d *Deferral) Abort() {
	_, abort := d.end()
	for _, a := range abort {
		a()
	}
}
