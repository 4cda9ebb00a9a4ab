package fabric

import (
	"context"
	"fmt"
	"time"

	"github.com/esf-dev/esf/cas"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/gc"
	"github.com/esf-dev/esf/journal"
)

// Garbage collection (FR-06). Live content is what the graph can still
// select: the root of every node that is not pruned (pruning takes whole
// subtrees, so that set is closed under ancestry and includes every leased
// node, since a leased subtree cannot be pruned), the base root of every
// live attempt, and every evaluation's evidence. Everything else in the
// store is swept in bounded batches while fork, activate and seal go on:
// the store is wrapped in a gc.Tracker that records what writers store or
// find during a collection, and seal, import and merge run as tracker
// sessions, so content written or re-referenced after a collection starts
// is never deleted (see package gc for the contract).

// CollectRequest runs one collection.
type CollectRequest struct {
	DryRun bool `json:"dry_run,omitempty"`
	// Remote collects the remote content store (esfd --cas-remote) instead
	// of the local one; RemoteGraceSeconds keeps keys younger than that
	// (default 3600).
	Remote             bool  `json:"remote,omitempty"`
	RemoteGraceSeconds int64 `json:"remote_grace_seconds,omitempty"`
}

// CollectReport is what a collection found and reclaimed.
type CollectReport struct {
	gc.Report
	Millis int64 `json:"ms"`
	// Remote is the remote collection's report (CollectRequest.Remote).
	Remote *s3store.CollectReport `json:"remote,omitempty"`
}

// Collect garbage-collects the content store. A second collection while
// one runs fails with ErrFailedPrecondition.
func (f *Fabric) Collect(ctx context.Context, req CollectRequest) (CollectReport, error) {
	if req.Remote {
		return f.collectRemote(ctx, req)
	}
	start := time.Now()
	rep, err := gc.Collect(ctx, f.store, f.liveRoots, gc.SweepOptions{DryRun: req.DryRun})
	if err != nil {
		return CollectReport{}, fmt.Errorf("gc: %w", err)
	}
	if !req.DryRun {
		f.gcStats.runs.Add(1)
		f.gcStats.deleted.Add(rep.Deleted)
		f.gcStats.bytes.Add(rep.BytesReclaimed)
	}
	f.log.Info("gc", "dry_run", req.DryRun, "examined", rep.Examined, "live", rep.Live,
		"deleted", rep.Deleted, "bytes_reclaimed", rep.BytesReclaimed, "ms", time.Since(start).Milliseconds())
	return CollectReport{Report: rep, Millis: time.Since(start).Milliseconds()}, nil
}

// liveRoots lists the roots the graph pins and the evidence objects.
func (f *Fabric) liveRoots(ctx context.Context) (roots, extra []cas.ID, err error) {
	seen := map[cas.ID]bool{}
	add := func(list *[]cas.ID, hex string) error {
		id, err := cas.ParseID(hex)
		if err != nil {
			return err
		}
		if !seen[id] {
			seen[id] = true
			*list = append(*list, id)
		}
		return nil
	}
	err = f.journal.View(ctx, func(r journal.Reader) error {
		err := journal.Nodes(r, func(n journal.Node) error {
			if n.Status == journal.NodePruned {
				return nil
			}
			return add(&roots, n.RootID)
		})
		if err != nil {
			return err
		}
		err = journal.Evaluations(r, func(e journal.Evaluation) error {
			for _, ev := range e.Evidence {
				if err := add(&extra, ev); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		// Live attempts' base roots (a draft's base stays its parent's root
		// even after a sibling sealed the draft).
		return liveAttemptRoots(r, func(hex string) error { return add(&roots, hex) })
	})
	return roots, extra, err
}

// liveAttemptRoots calls add with the base root of every attempt that
// holds a lease: the lower layer its mount reads.
func liveAttemptRoots(r journal.Reader, add func(hex string) error) error {
	return journal.ExpiredLeases(r, time.Unix(1<<40, 0), func(lid string) error {
		l, err := journal.GetLease(r, lid)
		if err != nil {
			return err
		}
		rt, err := journal.GetAttemptRuntime(r, l.AttemptID)
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		// A record that does not say which root is under the mount
		// stops the walk: a collection must not free it.
		d, err := runtimeData(&rt)
		if err != nil {
			return err
		}
		if d.BaseRootID != "" {
			return add(d.BaseRootID)
		}
		return nil
	})
}

// pinnedRoots are the roots the content cache keeps (cas/tier): those of
// live attempts, and those read-only mounts show.
func (f *Fabric) pinnedRoots(ctx context.Context) ([]cas.ID, error) {
	var roots []cas.ID
	err := f.journal.View(ctx, func(r journal.Reader) error {
		return liveAttemptRoots(r, func(hex string) error {
			id, err := cas.ParseID(hex)
			if err == nil {
				roots = append(roots, id)
			}
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	mounted, err := f.mountedRoots()
	return append(roots, mounted...), err
}

// mountedRoots are the roots that read-only mounts (Mount without RW)
// show: binds of the projection's roots/<id> directories. They are read
// from mountinfo, not remembered, so they are found after a restart too,
// as the mounts outlive it.
func (f *Fabric) mountedRoots() ([]cas.ID, error) {
	if f.projection == nil {
		return nil, nil
	}
	views, err := f.mounter.Views(f.projection.mnt)
	if err != nil {
		return nil, err
	}
	var roots []cas.ID
	seen := map[cas.ID]bool{}
	for _, v := range views {
		if !v.RootID.IsZero() && !seen[v.RootID] {
			seen[v.RootID] = true
			roots = append(roots, v.RootID)
		}
	}
	return roots, nil
}

// remoteCollector is the remote store's GC (cas/s3).
type remoteCollector interface {
	Collect(ctx context.Context, opts s3store.CollectOptions) (s3store.CollectReport, error)
}

// collectRemote collects the remote content store with the local GC's
// writer protocol: an epoch of the tracker every write of this daemon goes
// through, the marked set, and deletions under the tracker's per-id locks
// (each deleted id is forgotten by the cache's "known remote" set under the
// same lock, so a write that dedups against it uploads it again). Writes of
// other workers follow the shared record's protocol (remotegc.go); the
// grace period (keys younger than it stay) is a second line.
func (f *Fabric) collectRemote(ctx context.Context, req CollectRequest) (CollectReport, error) {
	start := time.Now()
	rc, ok := f.opts.Remote.(remoteCollector)
	if f.tier == nil || !ok {
		return CollectReport{}, fmt.Errorf("gc --remote: no remote content store (esfd --cas-remote): %w", errdefs.ErrFailedPrecondition)
	}
	ep, err := f.store.Begin()
	if err != nil {
		return CollectReport{}, fmt.Errorf("gc --remote: %w", err)
	}
	defer ep.End()
	if err := ep.Wait(ctx); err != nil {
		return CollectReport{}, fmt.Errorf("gc --remote: %w", err)
	}
	if !req.DryRun {
		// Other workers' writers: the shared record (remotegc.go). The
		// mark below reads the journal after this commit.
		st, err := f.beginRemoteGC(ctx)
		if err != nil {
			return CollectReport{}, fmt.Errorf("gc --remote: %w", err)
		}
		defer func() {
			if err := f.endRemoteGC(ctx, st); err != nil {
				f.log.Warn("gc --remote: mark the collection ended", "err", err)
			}
		}()
	}
	roots, extra, err := f.liveRoots(ctx)
	if err != nil {
		return CollectReport{}, fmt.Errorf("gc --remote: roots: %w", err)
	}
	roots = append(roots, ep.Deps()...)
	live := gc.NewSet()
	if err := gc.Mark(ctx, f.store, roots, extra, live.Add); err != nil {
		return CollectReport{}, fmt.Errorf("gc --remote: %w", err)
	}
	grace := time.Hour
	if req.RemoteGraceSeconds > 0 {
		grace = time.Duration(req.RemoteGraceSeconds) * time.Second
	}
	rrep, err := rc.Collect(ctx, s3store.CollectOptions{
		Live: live.Has, Grace: grace, DryRun: req.DryRun, Now: f.now,
		Guard: func(ids []cas.ID, fn func(keep func(cas.ID) bool) error) error {
			// A worker that lost its registration is no longer the owner
			// other workers wait for: it deletes nothing more.
			if f.Fenced() {
				return fmt.Errorf("this worker's registration (lease) is lost: %w", errdefs.ErrFailedPrecondition)
			}
			return f.store.Guard(ids, func(keep func(cas.ID) bool) error {
				err := fn(keep)
				f.tier.Forget(ids)
				return err
			})
		},
	})
	if err != nil {
		return CollectReport{}, fmt.Errorf("gc --remote: %w", err)
	}
	f.log.Info("gc --remote", "dry_run", req.DryRun, "live", live.Len(), "examined", rrep.Examined, "deleted", rrep.Deleted,
		"bytes_reclaimed", rrep.BytesReclaimed, "packs_rewritten", rrep.PacksRewritten, "packs_deleted", rrep.PacksDeleted,
		"orphans", rrep.Orphans, "kept_young", rrep.KeptYoung, "ms", time.Since(start).Milliseconds())
	return CollectReport{Report: gc.Report{Examined: rrep.Examined, Live: int64(live.Len()), Deleted: rrep.Deleted,
		BytesReclaimed: rrep.BytesReclaimed, DryRun: req.DryRun}, Millis: time.Since(start).Milliseconds(), Remote: &rrep}, nil
}
