package fabric

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
	"github.com/esf-dev/esf/treediff"
)

// OpMerge names the merge operation.
const OpMerge = "merge"

func init() {
	opFailpoints[OpMerge] = [2]string{
		failpoint.Declare("fabric." + OpMerge + ".before-update"),
		failpoint.Declare("fabric." + OpMerge + ".after-commit"),
	}
}

// MergeRequest merges sealed nodes of one group.
type MergeRequest struct {
	Nodes []string `json:"nodes"`
	// Base is the common ancestor to merge against; the lowest common
	// ancestor in the graph when empty.
	Base         string          `json:"base,omitempty"`
	LogicalState json.RawMessage `json:"logical_state,omitempty"`
	// Promote makes the merged node canonical, by compare-and-swap from
	// ExpectedGeneration, in the same batch that creates it.
	Promote            bool   `json:"promote,omitempty"`
	ExpectedGeneration uint64 `json:"expected_generation,omitempty"`
}

// MergeResult is the merged node and, with Promote, the group after it.
type MergeResult struct {
	Node  journal.Node   `json:"node"`
	Base  string         `json:"base"`
	Group *journal.Group `json:"group,omitempty"`
}

// Merge three-way merges the nodes' roots against their lowest common
// ancestor (or req.Base), path by path. Identical changes combine;
// conflicting ones fail with ErrConflict naming every conflicting path, and
// no node is created. Success seals a node whose parents are the inputs.
// With Promote, a stale ExpectedGeneration fails with ErrStaleGeneration
// and creates nothing (FR-04).
func (f *Fabric) Merge(ctx context.Context, req MergeRequest) (MergeResult, error) {
	var res MergeResult
	if len(req.Nodes) < 2 {
		return res, fmt.Errorf("merge: want at least two nodes: %w", journal.ErrInvalidArgument)
	}
	for _, id := range req.Nodes {
		if err := journal.CheckID(journal.KindNode, id); err != nil {
			return res, fmt.Errorf("merge: %w", err)
		}
	}
	if req.Promote && req.ExpectedGeneration == 0 {
		return res, fmt.Errorf("merge --promote: expected_generation is required: %w", journal.ErrInvalidArgument)
	}
	if err := checkJSON("logical_state", req.LogicalState); err != nil {
		return res, err
	}
	// A GC session from before the inputs are checked until the merged
	// node is committed: the merge re-uses their content.
	leave := f.store.Enter()
	defer leave()
	ctx = f.remoteSession(ctx)
	// Read the inputs and the base, then merge the trees outside any
	// transaction; the commit re-checks everything it depends on.
	var heads []journal.Node
	base := req.Base
	err := f.journal.View(ctx, func(r journal.Reader) error {
		for _, id := range req.Nodes {
			n, err := journal.GetNode(r, id)
			if err != nil {
				return err
			}
			if n.Status != journal.NodeSealed && n.Status != journal.NodeTerminal {
				return fmt.Errorf("node %s is %s; only sealed nodes merge: %w", id, n.Status, journal.ErrFailedPrecondition)
			}
			if len(heads) > 0 && n.GroupID != heads[0].GroupID {
				return fmt.Errorf("nodes %s and %s are in different groups: %w", heads[0].NodeID, id, journal.ErrInvalidArgument)
			}
			heads = append(heads, n)
		}
		if base == "" {
			var err error
			base, err = lowestCommonAncestor(r, req.Nodes)
			return err
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("merge: %w", err)
	}
	baseRoot, err := f.resolveRoot(ctx, base)
	if err != nil {
		return res, fmt.Errorf("merge: base: %w", err)
	}
	roots := make([]cas.ID, len(heads))
	for i, h := range heads {
		if roots[i], err = cas.ParseID(h.RootID); err != nil {
			return res, err
		}
	}
	merged, err := treediff.Merge(ctx, f.store, baseRoot, roots)
	if err != nil {
		return res, fmt.Errorf("merge: %w", err)
	}
	req.Base = base
	err = f.mutate(ctx, OpMerge, req, &res, func(tx journal.Tx, ci CallInfo) (any, error) {
		for _, h := range heads {
			n, err := journal.GetNode(tx, h.NodeID)
			if err != nil {
				return nil, err
			}
			if n.Status != journal.NodeSealed && n.Status != journal.NodeTerminal {
				return nil, fmt.Errorf("node %s became %s: %w", n.NodeID, n.Status, journal.ErrFailedPrecondition)
			}
		}
		id, err := f.ids.New(journal.KindNode)
		if err != nil {
			return nil, err
		}
		state := req.LogicalState
		if state == nil {
			state = heads[0].LogicalState
		}
		n := journal.Node{NodeID: id, GroupID: heads[0].GroupID, Parents: slices.Clone(req.Nodes), RootID: merged.String(),
			LogicalState: state, Status: journal.NodeSealed, CreatedAt: tx.Now(),
			Provenance: journal.Provenance{Op: OpMerge, IdempotencyKey: ci.IdempotencyKey, TraceID: ci.TraceID}}
		if err := journal.CreateNode(tx, n); err != nil {
			return nil, err
		}
		if err := event(tx, ci, n.Event("node.merged"), map[string]any{"parents": req.Nodes, "base": base}); err != nil {
			return nil, err
		}
		out := MergeResult{Node: n, Base: base}
		if req.Promote {
			g, err := promote(tx, ci, n.GroupID, n.NodeID, req.ExpectedGeneration)
			if err != nil {
				return nil, err
			}
			out.Group = &g
		}
		return out, nil
	})
	return res, err
}

// lowestCommonAncestor finds the nearest node that is an ancestor (or
// itself) of every input. In a DAG there may be several minimal common
// ancestors; the most recently created one wins (ids are time-ordered).
func lowestCommonAncestor(r journal.Reader, nodes []string) (string, error) {
	var common map[string]bool
	for _, id := range nodes {
		set := map[string]bool{id: true}
		if err := journal.Ancestors(r, id, func(a journal.Node) error {
			set[a.NodeID] = true
			return nil
		}); err != nil {
			return "", err
		}
		if common == nil {
			common = set
			continue
		}
		for k := range common {
			if !set[k] {
				delete(common, k)
			}
		}
	}
	// Drop every common ancestor that is an ancestor of another one.
	for c := range common {
		if err := journal.Ancestors(r, c, func(a journal.Node) error {
			delete(common, a.NodeID)
			return nil
		}); err != nil {
			return "", err
		}
	}
	if len(common) == 0 {
		return "", fmt.Errorf("nodes %v share no ancestor: %w", nodes, journal.ErrInvalidArgument)
	}
	best := ""
	for c := range common {
		if c > best {
			best = c
		}
	}
	return best, nil
}
