package fabric

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/esf-dev/esf/cas"
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
}

// CollectReport is what a collection found and reclaimed.
type CollectReport struct {
	gc.Report
	Millis int64 `json:"ms"`
}

// Collect garbage-collects the content store. A second collection while
// one runs fails with ErrFailedPrecondition.
func (f *Fabric) Collect(ctx context.Context, req CollectRequest) (CollectReport, error) {
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
		var d rtData
		if json.Unmarshal(rt.Data, &d) == nil && d.BaseRootID != "" {
			return add(d.BaseRootID)
		}
		return nil
	})
}

// pinnedRoots are the roots the content cache keeps (cas/tier): those of
// live attempts.
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
	return roots, err
}
