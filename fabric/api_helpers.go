package fabric

import (
	"context"
	"fmt"

	"github.com/esf-dev/esf/journal"
)

// Read-only helpers the API needs beside the operations: the event log and
// the rewards that tree shows. They write nothing.

// Events calls fn, on the caller's goroutine, for every committed event
// after seq `after` that filter matches, in order. Without follow it returns
// once the events committed so far are delivered; with follow it then waits
// for new ones (without polling) until ctx ends (it returns ctx.Err()), fn
// fails (its error is returned) or the journal closes (journal.ErrClosed).
func (f *Fabric) Events(ctx context.Context, after uint64, filter journal.EventFilter, follow bool, fn func(journal.Event) error) error {
	if follow {
		return journal.Follow(ctx, f.journal, after, filter, fn)
	}
	_, err := journal.Events(ctx, f.journal, after, filter, fn)
	return err
}

// LastEventSeq is the sequence number of the newest committed event (0 if
// none), so a follower can start from now.
func (f *Fabric) LastEventSeq(ctx context.Context) (uint64, error) {
	return journal.LastSeq(ctx, f.journal)
}

// LatestRewards maps each node of a group that has evaluations to the
// reward of its newest one (by creation time, then id), in one snapshot.
func (f *Fabric) LatestRewards(ctx context.Context, groupID string) (map[string]float64, error) {
	if err := journal.CheckID(journal.KindGroup, groupID); err != nil {
		return nil, fmt.Errorf("rewards: %w", err)
	}
	out := map[string]float64{}
	err := f.journal.View(ctx, func(r journal.Reader) error {
		if _, err := journal.GetGroup(r, groupID); err != nil {
			return err
		}
		return journal.NodesOfGroup(r, groupID, func(nodeID string) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			ids, err := journal.EvaluationsOfNode(r, nodeID)
			if err != nil {
				return err
			}
			var newest *journal.Evaluation
			for _, id := range ids {
				e, err := journal.GetEvaluation(r, id)
				if err != nil {
					return err
				}
				if newest == nil || e.CreatedAt.After(newest.CreatedAt) ||
					e.CreatedAt.Equal(newest.CreatedAt) && e.EvaluationID > newest.EvaluationID {
					newest = &e
				}
			}
			if newest != nil {
				out[nodeID] = newest.Reward
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("rewards of %s: %w", groupID, err)
	}
	return out, nil
}
