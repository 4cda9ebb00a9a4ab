package fabric

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
)

// One flush per seal. With the embedded journal (pebble) and the local
// store, a seal's small batch (a few changed files and the trees above
// them: at most cas.DeferMaxObjects objects, cas.DeferMaxBytes bytes) is
// not made durable by the store: its objects' bytes ride in the seal's own
// journal transaction, one value per object under
//
//	store-redo/<object id>/<seal nonce>    the object's bytes (its redo record)
//
// so the one fdatasync of the journal's WAL that commits the node makes
// them durable too (cas.Deferral). The graph never lists these keys. The
// seal's own nonce ends each key, so a record is deleted only by the seal
// that wrote it (or the replay) and a seal can tell its own records from
// another's of the same object. The
// protocol, and what a crash leaves at each point:
//
//  1. The seal writes the objects into temp files of the store, unflushed,
//     and publishes nothing under objects/. A crash here leaves no node,
//     no record and no object (the temp files are removed or, if whole,
//     linked in with an fsync by the store's Open: garbage for GC).
//  2. One journal transaction commits the node and the records. A crash
//     before it commits is point 1; after it, the records are durable.
//  3. The objects are linked into objects/, nothing flushed, before the
//     seal returns (settleDeferral), so readers find them. A crash between
//     2 and 3 (the objects missing), or after 3 before the store flushed
//     them (missing, or their bytes damaged by a machine crash), is
//     repaired by point 4. A reader of the new node between 2 and 3
//     (another client that listed it) finds objects missing: the
//     projection answers ENOENT without caching it (fusefs), an export
//     or a collection's mark fails with not found and can be retried.
//  4. Open, before anything reads the store or serves, replays every
//     record: an object the store lacks or holds damaged is written again
//     and made durable (local.Store.Redo, the store's own replay), a whole
//     one is fsynced; then the records are deleted. A crash during the
//     replay leaves the records (deleted only after every object is
//     durable): the next Open replays them again.
//  5. Records of published objects are retired by a later transaction
//     (unsynced: a record that outlives a crash only makes Open replay a
//     durable object) once a syncfs of the store has made their objects
//     durable by themselves: when they pass storeRedoRetireBytes, and at
//     Close.
//
// GC: an object of a committed batch is in the store before the seal's
// GC session ends (its Put was recorded, and a collection waits for the
// sessions open when it began), and Open's replay runs before any
// collection, so none can sweep it. A record whose object was collected
// since (its node pruned) brings it back at the next Open: garbage that
// the next collection removes again.
//
// A seal whose journal transaction fails publishes nothing (Abort) when
// the records are known absent; if that cannot be read, every object is
// written durably by itself (Redo), which is correct either way.
const prefixStoreRedo = "store-redo/"

// storeRedoRetireBytes: the published records' bytes after which a syncfs
// of the store retires them.
const storeRedoRetireBytes = 8 << 20

// Crash boundary of the one-flush seal: after its objects were published
// (point 3), before their records are retired.
var fpSealPublished = failpoint.Declare("fabric.suspend.after-publish")

// storeRedo holds the keys of the records of published objects not yet
// retired.
type storeRedo struct {
	mu       sync.Mutex
	keys     []string
	bytes    int
	retiring bool
}

// sealRedo is one seal's Deferral and the nonce of its records.
type sealRedo struct {
	*cas.Deferral
	nonce string
}

func (s *sealRedo) key(id cas.ID) []byte {
	return []byte(prefixStoreRedo + id.String() + "/" + s.nonce)
}

// sealDeferral returns ctx carrying a fresh Deferral for a seal's batches,
// or ctx and nil when the journal and the store do not share a flush.
func (f *Fabric) sealDeferral(ctx context.Context) (context.Context, *sealRedo) {
	if f.redo == nil {
		return ctx, nil
	}
	d := &sealRedo{Deferral: &cas.Deferral{}, nonce: strconv.FormatUint(rand.Uint64(), 16)}
	return cas.WithDeferral(ctx, d.Deferral), d
}

// putStoreRedo writes d's records in tx (point 2).
func putStoreRedo(tx journal.Tx, d *sealRedo) error {
	if d == nil {
		return nil
	}
	for _, o := range d.Objects() {
		if err := tx.Put(d.key(o.ID), o.Data); err != nil {
			return fmt.Errorf("redo record of %s: %w", o.ID, err)
		}
	}
	return nil
}

// settleDeferral ends d once the seal's transaction has committed or
// failed: it publishes d's objects if their records are in the journal
// (point 3), drops them if not.
func (f *Fabric) settleDeferral(ctx context.Context, d *sealRedo) {
	if d == nil {
		return
	}
	objs := d.Objects()
	if len(objs) == 0 {
		d.Abort()
		return
	}
	ctx = context.WithoutCancel(ctx)
	recorded := true
	err := f.journal.View(ctx, func(r journal.Reader) error {
		for _, o := range objs {
			if _, err := r.Get(d.key(o.ID)); errors.Is(err, journal.ErrNotFound) {
				recorded = false
				return nil
			} else if err != nil {
				return err
			}
		}
		return nil
	})
	switch {
	case err != nil:
		// Unknown: durable by itself, whether or not a node names it.
		f.log.Error("seal: cannot read the redo records: storing the objects durably", "err", err)
		d.Abort()
		f.redoObjects(objs)
		return
	case !recorded:
		d.Abort()
		return
	}
	if err := d.Publish(ctx); err != nil {
		f.log.Error("seal: publishing the objects failed: storing them durably", "err", err)
		// Only the records of stored objects may be retired: an object
		// neither published nor redone is only in its record, which
		// stays for Open's replay.
		objs = f.redoObjects(objs)
	}
	f.noteStoreRedo(d, objs)
}

// redoObjects stores objs durably one by one and returns those it stored;
// what fails stays in its record (if any) for Open's replay.
func (f *Fabric) redoObjects(objs []cas.DeferredObject) []cas.DeferredObject {
	var stored []cas.DeferredObject
	for _, o := range objs {
		if err := f.local.Redo(o.ID, o.Data); err != nil {
			f.log.Error("seal: store object", "object_id", o.ID.String(), "err", err)
			continue
		}
		stored = append(stored, o)
	}
	return stored
}

// noteStoreRedo queues the records of published objs for retirement and
// starts it once they pass storeRedoRetireBytes.
func (f *Fabric) noteStoreRedo(d *sealRedo, objs []cas.DeferredObject) {
	r := f.redo
	r.mu.Lock()
	for _, o := range objs {
		r.keys = append(r.keys, string(d.key(o.ID)))
		r.bytes += len(o.Data)
	}
	start := r.bytes >= storeRedoRetireBytes && !r.retiring
	if start {
		r.retiring = true
	}
	r.mu.Unlock()
	if start {
		f.bg.Go(func() {
			if err := f.retireStoreRedo(context.Background()); err != nil {
				f.log.Error("retire redo records", "err", err)
			}
		})
	}
}

// retireStoreRedo flushes the store and deletes the records of every
// object published before the flush (point 5).
func (f *Fabric) retireStoreRedo(ctx context.Context) error {
	r := f.redo
	r.mu.Lock()
	keys, n := r.keys, r.bytes
	r.keys, r.bytes = nil, 0
	r.mu.Unlock()
	err := f.retireRecords(ctx, keys)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retiring = false
	if err != nil {
		r.keys, r.bytes = append(keys, r.keys...), r.bytes+n
	}
	return err
}

func (f *Fabric) retireRecords(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := f.local.Sync(); err != nil {
		return err
	}
	return deleteStoreRedo(ctx, f.journal, keys)
}

// deleteStoreRedo deletes the records under keys, a bounded number per
// transaction.
func deleteStoreRedo(ctx context.Context, j journal.Store, keys []string) error {
	for len(keys) > 0 {
		n := min(len(keys), 1024)
		chunk := keys[:n]
		keys = keys[n:]
		if err := j.Update(ctx, func(tx journal.Tx) error {
			for _, k := range chunk {
				if err := tx.Delete([]byte(k)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("delete redo records: %w", err)
		}
	}
	return nil
}

// replayStoreRedo is point 4: every record's object made stored, whole
// and durable, then the records deleted. Open calls it before anything
// reads the store.
func (f *Fabric) replayStoreRedo(ctx context.Context) error {
	var keys []string
	err := f.journal.View(ctx, func(r journal.Reader) error {
		return journal.ScanPrefix(r, []byte(prefixStoreRedo), func(k, v []byte) error {
			name, _, _ := strings.Cut(string(k[len(prefixStoreRedo):]), "/")
			id, err := cas.ParseID(name)
			if err != nil {
				return fmt.Errorf("redo record %q: %w", k, journal.ErrCorrupt)
			}
			if err := f.local.Redo(id, v); err != nil {
				return err
			}
			keys = append(keys, string(k))
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("replay redo records: %w", err)
	}
	if len(keys) > 0 {
		f.log.Info("replayed the redo records of sealed objects", "objects", len(keys))
	}
	if err := failpoint.Inject(fpRedoReplayed); err != nil {
		return err
	}
	return deleteStoreRedo(ctx, f.journal, keys)
}

// Crash boundary of Open's replay: every record replayed, none deleted.
var fpRedoReplayed = failpoint.Declare("esfd.open.after-redo-replay")
