package fabric

import (
	"context"
	"encoding/json"
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
			return newestReward(r, nodeID, out)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("rewards of %s: %w", groupID, err)
	}
	return out, nil
}

// newestReward sets out[nodeID] to the reward of the node's newest
// evaluation (by creation time, then id), if it has any.
func newestReward(r journal.Reader, nodeID string, out map[string]float64) error {
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
}

// TreeRecords is what Tree and LatestRewards return together, with each
// node as its stored JSON (journal.GetNodeJSON) instead of a decoded
// journal.Node: GET /v1/tree passes the records through.
type TreeRecords struct {
	Group   journal.Group      `json:"group"`
	Nodes   []json.RawMessage  `json:"nodes"`   // each the JSON of a journal.Node
	Rewards map[string]float64 `json:"rewards"` // as LatestRewards
}

// TreeRecords reads a group's nodes and their newest rewards in one
// snapshot, without decoding the nodes: the tree of a 10,000-node group
// for the web view (issue 23), where decoding each record only to encode
// it again was most of the answer's cost.
func (f *Fabric) TreeRecords(ctx context.Context, groupID string) (TreeRecords, error) {
	out := TreeRecords{Nodes: []json.RawMessage{}, Rewards: map[string]float64{}}
	if err := journal.CheckID(journal.KindGroup, groupID); err != nil {
		return out, fmt.Errorf("tree: %w", err)
	}
	err := f.journal.View(ctx, func(r journal.Reader) error {
		g, err := journal.GetGroup(r, groupID)
		if err != nil {
			return err
		}
		out.Group = g
		return journal.NodesOfGroup(r, groupID, func(id string) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := journal.GetNodeJSON(r, id)
			if err != nil {
				return err
			}
			out.Nodes = append(out.Nodes, n)
			return newestReward(r, id, out.Rewards)
		})
	})
	if err != nil {
		return TreeRecords{}, fmt.Errorf("tree: %w", err)
	}
	return out, nil
}
