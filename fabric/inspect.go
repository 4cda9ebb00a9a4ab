package fabric

import (
	"context"
	"fmt"

	"github.com/esf-dev/esf/journal"
)

var kindNoun = map[journal.Kind]string{
	journal.KindGroup: "group", journal.KindNode: "node", journal.KindAttempt: "attempt",
	journal.KindEvaluation: "evaluation", journal.KindLease: "lease",
}

// NodeView is a node with what inspect shows around it.
type NodeView struct {
	journal.Node
	// Ancestry lists the ancestors nearest first, ending at the group root.
	Ancestry    []string             `json:"ancestry"`
	Children    []string             `json:"children"`
	Attempts    []string             `json:"attempts"`
	Leases      []journal.Lease      `json:"leases"`
	Evaluations []journal.Evaluation `json:"evaluations"`
}

// AttemptView is an attempt with its lease and, on this worker, its runtime.
type AttemptView struct {
	journal.Attempt
	Lease   *journal.Lease          `json:"lease,omitempty"`
	Runtime *journal.AttemptRuntime `json:"runtime,omitempty"`
	// Root is where the attempt's writable root is mounted on this worker.
	Root string `json:"root,omitempty"`
}

// portable is v without what only this worker knows (its runtime record
// and root path): what durable state may keep of it.
func (v *AttemptView) portable() *AttemptView {
	p := *v
	p.Runtime, p.Root = nil, ""
	return &p
}

// GroupView is a group with its size.
type GroupView struct {
	journal.Group
	Nodes int `json:"nodes"`
}

// Inspection is the answer of inspect: exactly one field is set.
type Inspection struct {
	Kind    string       `json:"kind"`
	Group   *GroupView   `json:"group,omitempty"`
	Node    *NodeView    `json:"node,omitempty"`
	Attempt *AttemptView `json:"attempt,omitempty"`
}

// Inspect reads a group, node or attempt by id.
func (f *Fabric) Inspect(ctx context.Context, id string) (Inspection, error) {
	kind, err := journal.KindOf(id)
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect: %w", err)
	}
	out := Inspection{Kind: kindNoun[kind]}
	err = f.journal.View(ctx, func(r journal.Reader) error {
		switch kind {
		case journal.KindGroup:
			g, err := journal.GetGroup(r, id)
			if err != nil {
				return err
			}
			v := &GroupView{Group: g}
			err = journal.NodesOfGroup(r, id, func(string) error { v.Nodes++; return nil })
			out.Group = v
			return err
		case journal.KindNode:
			v, err := nodeView(r, id)
			out.Node = v
			return err
		case journal.KindAttempt:
			v, err := attemptView(r, id)
			out.Attempt = v
			return err
		case journal.KindEvaluation:
			return fmt.Errorf("inspect %s: evaluations are shown by inspecting their node: %w", id, journal.ErrInvalidArgument)
		}
		return fmt.Errorf("inspect %s: %w", id, journal.ErrInvalidArgument)
	})
	if err != nil {
		return Inspection{}, fmt.Errorf("inspect: %w", err)
	}
	return out, nil
}

func nodeView(r journal.Reader, id string) (*NodeView, error) {
	n, err := journal.GetNode(r, id)
	if err != nil {
		return nil, err
	}
	v := &NodeView{Node: n, Ancestry: []string{}, Leases: []journal.Lease{}, Evaluations: []journal.Evaluation{}}
	if err := journal.Ancestors(r, id, func(a journal.Node) error {
		v.Ancestry = append(v.Ancestry, a.NodeID)
		return nil
	}); err != nil {
		return nil, err
	}
	if v.Children, err = journal.ChildrenOf(r, id); err != nil {
		return nil, err
	}
	if v.Attempts, err = journal.AttemptsOfNode(r, id); err != nil {
		return nil, err
	}
	leases, err := journal.LeasesOfNode(r, id)
	if err != nil {
		return nil, err
	}
	for _, lid := range leases {
		l, err := journal.GetLease(r, lid)
		if err != nil {
			return nil, err
		}
		v.Leases = append(v.Leases, l)
	}
	evals, err := journal.EvaluationsOfNode(r, id)
	if err != nil {
		return nil, err
	}
	for _, eid := range evals {
		e, err := journal.GetEvaluation(r, eid)
		if err != nil {
			return nil, err
		}
		v.Evaluations = append(v.Evaluations, e)
	}
	if v.Children == nil {
		v.Children = []string{}
	}
	if v.Attempts == nil {
		v.Attempts = []string{}
	}
	return v, nil
}

func attemptView(r journal.Reader, id string) (*AttemptView, error) {
	a, err := journal.GetAttempt(r, id)
	if err != nil {
		return nil, err
	}
	v := &AttemptView{Attempt: a}
	if a.LeaseID != "" {
		if l, err := journal.GetLease(r, a.LeaseID); err == nil {
			v.Lease = &l
		} else if !isNotFound(err) {
			return nil, err
		}
	}
	if rt, err := journal.GetAttemptRuntime(r, id); err == nil {
		v.Runtime = &rt
		v.Root = rt.Mount
	} else if !isNotFound(err) {
		return nil, err
	}
	return v, nil
}

// TreeView is a whole group graph, nodes in creation order.
type TreeView struct {
	Group journal.Group  `json:"group"`
	Nodes []journal.Node `json:"nodes"`
}

// Tree reads every node of a group.
func (f *Fabric) Tree(ctx context.Context, groupID string) (TreeView, error) {
	var out TreeView
	if err := journal.CheckID(journal.KindGroup, groupID); err != nil {
		return out, fmt.Errorf("tree: %w", err)
	}
	err := f.journal.View(ctx, func(r journal.Reader) error {
		g, err := journal.GetGroup(r, groupID)
		if err != nil {
			return err
		}
		out = TreeView{Group: g, Nodes: []journal.Node{}}
		return journal.NodesOfGroup(r, groupID, func(id string) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := journal.GetNode(r, id)
			if err != nil {
				return err
			}
			out.Nodes = append(out.Nodes, n)
			return nil
		})
	})
	if err != nil {
		return TreeView{}, fmt.Errorf("tree: %w", err)
	}
	return out, nil
}
