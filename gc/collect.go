package gc

import (
	"context"
	"fmt"

	"github.com/esf-dev/esf/cas"
)

// RootsFunc returns what is live: roots (trees, walked) and extra objects
// (marked as they are). Collect calls it once, after the epoch began and the
// sessions older than it left.
type RootsFunc func(ctx context.Context) (roots, extra []cas.ID, err error)

// Collect runs one whole collection on the store behind t:
//
//  1. Begin an epoch: from now on writers' ids are recorded.
//  2. Wait for the sessions that entered before it to leave.
//  3. Ask roots for the live roots, then add the deps of open sessions.
//  4. Mark everything reachable from them.
//  5. Sweep: delete, in batches, what the walk lists that is neither marked
//     nor recorded by the epoch, each check and deletion atomic with
//     respect to writers.
//
// opts.Protect, if set, is consulted besides the epoch. Report.Live counts
// the marked objects. Collect returns ErrBusy if another collection runs on
// t.
func Collect(ctx context.Context, t *Tracker, roots RootsFunc, opts SweepOptions) (Report, error) {
	ep, err := t.Begin()
	if err != nil {
		return Report{}, err
	}
	defer ep.End()
	if err := ep.Wait(ctx); err != nil {
		return Report{}, fmt.Errorf("gc: %w", err)
	}
	rs, extra, err := roots(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("gc: roots: %w", err)
	}
	// After the roots: a session that entered later checked its deps were
	// live after the roots were read, so they are among the roots.
	rs = append(rs, ep.Deps()...)
	live := NewSet()
	if err := Mark(ctx, t, rs, extra, live.Add); err != nil {
		return Report{}, fmt.Errorf("gc: %w", err)
	}
	protect := ep.Protected
	if p := opts.Protect; p != nil {
		protect = func(id cas.ID) bool { return ep.Protected(id) || p(id) }
	}
	opts.Protect = protect
	rep, err := Sweep(ctx, t, live.Has, opts)
	rep.Live = int64(live.Len())
	if err != nil {
		return rep, fmt.Errorf("gc: %w", err)
	}
	return rep, nil
}
