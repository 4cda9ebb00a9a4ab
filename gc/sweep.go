package gc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/esf-dev/esf/cas"
)

// SweepStore is what Sweep needs of a store.
type SweepStore interface {
	cas.Walker
	cas.Deleter
	cas.Statter
}

// GuardedDeleter is a store that can decide and delete in one step with
// respect to its writers. A Tracker is one: a writer that records an id
// either does so before DeleteUnless looks (and the object is kept) or
// after the object is gone (and the writer's Put stores it again).
type GuardedDeleter interface {
	// DeleteUnless deletes id unless keep(id) is true or a writer recorded
	// it, and reports what it deleted. A missing object is not deleted and
	// not an error.
	DeleteUnless(ctx context.Context, id cas.ID, keep func(cas.ID) bool) (info cas.Info, deleted bool, err error)
}

// DefaultBatchSize is how many objects Sweep deletes between pauses.
const DefaultBatchSize = 256

// SweepOptions tune Sweep. The zero value deletes in batches of
// DefaultBatchSize without pausing.
type SweepOptions struct {
	// DryRun counts what would be deleted and deletes nothing.
	DryRun bool
	// BatchSize bounds the deletions between two pauses; 0 means
	// DefaultBatchSize.
	BatchSize int
	// Protect, if set, spares ids the caller wants kept although live says
	// they are dead: objects written or referenced since the collection
	// started (Epoch.Protected). It is asked when the walk lists an object
	// and again right before it is deleted.
	Protect func(cas.ID) bool
	// Pause is slept between batches, so that other work on the store
	// (and its disk) goes on while a large sweep runs.
	Pause time.Duration
	// Workers delete a batch's objects in parallel; 0 means
	// DefaultWorkers. A deletion mostly waits for the file system (an
	// unlink of a written-back file frees its extents, a synchronous
	// discard on some disks), so several overlap well.
	Workers int
}

// DefaultWorkers is how many deletions Sweep runs at once by default.
const DefaultWorkers = 16

// Report is what a collection found and did.
type Report struct {
	// Examined counts the objects the walk listed.
	Examined int64 `json:"examined"`
	// Live counts the objects marked reachable (set by Collect).
	Live int64 `json:"live"`
	// Deleted counts the objects deleted, or that a dry run would delete.
	Deleted int64 `json:"deleted"`
	// BytesReclaimed sums their sizes.
	BytesReclaimed int64 `json:"bytes_reclaimed"`
	// Spared counts candidates found protected (or live, or already gone)
	// when their turn to be deleted came.
	Spared int64 `json:"spared"`
	// DryRun tells whether anything was actually deleted.
	DryRun bool `json:"dry_run"`
}

// Sweep deletes every object of s that is neither live nor protected.
//
// Candidates are the objects one Walk lists when Sweep starts, minus those
// live or Protect says to keep; an object stored after that walk is never a
// candidate. Candidates are deleted in batches of BatchSize with Pause
// between them, and each one is checked again (live, Protect) right before
// its deletion. If s is a GuardedDeleter the check and the deletion are one
// step with respect to the writers it tracks, which is what makes a
// concurrent sweep safe (see Tracker); on any other store the caller must
// keep writers out. Deleted objects and their bytes are counted as the
// store reports them right before deletion, so a concurrent sweep's work is
// not counted twice.
//
// Memory holds the candidates only. An error stops the sweep; what was
// deleted stays deleted and is in the report.
func Sweep(ctx context.Context, s SweepStore, live func(cas.ID) bool, opts SweepOptions) (Report, error) {
	rep := Report{DryRun: opts.DryRun}
	keep := func(id cas.ID) bool { return live(id) || (opts.Protect != nil && opts.Protect(id)) }
	var cands []cas.ID
	err := s.Walk(ctx, func(info cas.Info) error {
		rep.Examined++
		if !keep(info.ID) {
			cands = append(cands, info.ID)
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("sweep: %w", err)
	}
	batch := opts.BatchSize
	if batch <= 0 {
		batch = DefaultBatchSize
	}
	workers := opts.Workers
	if workers <= 0 {
		workers = DefaultWorkers
	}
	gd, guarded := s.(GuardedDeleter)
	del := func(id cas.ID) (cas.Info, bool, error) {
		switch {
		case opts.DryRun:
			return statUnless(ctx, s, id, keep)
		case guarded:
			return gd.DeleteUnless(ctx, id, keep)
		default:
			info, deleted, err := statUnless(ctx, s, id, keep)
			if deleted {
				err = s.Delete(ctx, id)
			}
			return info, deleted, err
		}
	}
	for start := 0; start < len(cands); start += batch {
		if start > 0 && opts.Pause > 0 {
			if err := sleep(ctx, opts.Pause); err != nil {
				return rep, fmt.Errorf("sweep: %w", err)
			}
		}
		if err := sweepBatch(ctx, cands[start:min(start+batch, len(cands))], workers, del, &rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// sweepBatch deletes ids with up to workers deletions at once and adds
// what it did to rep; the first error stops it (what was deleted stays
// counted).
func sweepBatch(ctx context.Context, ids []cas.ID, workers int, del func(cas.ID) (cas.Info, bool, error), rep *Report) error {
	var (
		mu       sync.Mutex
		firstErr error
		next     int
		wg       sync.WaitGroup
	)
	take := func() (cas.ID, bool) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr != nil || next == len(ids) {
			return cas.ID{}, false
		}
		if err := ctx.Err(); err != nil {
			firstErr = fmt.Errorf("sweep: %w", err)
			return cas.ID{}, false
		}
		next++
		return ids[next-1], true
	}
	for range min(workers, len(ids)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id, ok := take(); ok; id, ok = take() {
				info, deleted, err := del(id)
				mu.Lock()
				switch {
				case err != nil:
					if firstErr == nil {
						firstErr = fmt.Errorf("sweep %s: %w", id, err)
					}
				case !deleted:
					rep.Spared++
				default:
					rep.Deleted++
					rep.BytesReclaimed += info.Size
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// statUnless reports whether id would be deleted: not kept, still there.
func statUnless(ctx context.Context, s cas.Statter, id cas.ID, keep func(cas.ID) bool) (cas.Info, bool, error) {
	if keep(id) {
		return cas.Info{}, false, nil
	}
	info, err := s.Stat(ctx, id)
	if errors.Is(err, cas.ErrNotFound) {
		return cas.Info{}, false, nil
	}
	if err != nil {
		return cas.Info{}, false, err
	}
	return info, true, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
