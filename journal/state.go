package journal

import "fmt"

// NodeStatus is the state of a SandboxNode.
//
//	draft ──▶ sealed ──▶ terminal
//	  │         │           │
//	  └─────────┴───────────┴──▶ pruned
//
// A draft is a branch point created by fork: its root is its parent's, and it
// may be activated; the first successful seal of one of its attempts makes it
// sealed, fixing root_id and logical_state for good. Only a sealed node can
// be forked. An evaluation with --terminal makes a sealed node terminal (a
// finished leaf: still readable and selectable, never forked). prune marks a
// subtree pruned from any earlier status, drafts included; pruned is final,
// and nothing leaves it (GC reclaims it later).
type NodeStatus string

// The node statuses of the spec.
const (
	NodeDraft    NodeStatus = "draft"
	NodeSealed   NodeStatus = "sealed"
	NodeTerminal NodeStatus = "terminal"
	NodePruned   NodeStatus = "pruned"
)

// NodeStatuses lists every status in lifecycle order.
var NodeStatuses = []NodeStatus{NodeDraft, NodeSealed, NodeTerminal, NodePruned}

var nodeTransitions = map[NodeStatus][]NodeStatus{
	NodeDraft:    {NodeSealed, NodePruned},
	NodeSealed:   {NodeTerminal, NodePruned},
	NodeTerminal: {NodePruned},
}

// Valid reports whether s is one of NodeStatuses.
func (s NodeStatus) Valid() bool { return contains(NodeStatuses, s) }

// CanTransition reports whether a node may go from s to to. Staying in the
// same status is not a transition and is not allowed here.
func (s NodeStatus) CanTransition(to NodeStatus) bool { return contains(nodeTransitions[s], to) }

// AttemptState is the state of an ExecutionAttempt. The allowed moves:
//
//	queued     → active, failed, released
//	active     → quiescing, failed, released
//	quiescing  → active, sealed, failed
//	sealed     → released
//	failed     → released
//	released   (final)
//
// queued → active when a worker has the lease and the root mounted; active →
// quiescing while a seal stops writes; quiescing → sealed when the child node
// is committed (the attempt's execution ended), or back to active for a seal
// that keeps the attempt running; any live state → failed on an error or an
// expired lease. released is final: the lease is freed and the private
// delta may be reclaimed. A queued attempt can be released (cancelled) and an
// active one can be released without sealing (its work is discarded); a
// quiescing one must first finish sealing or fail, so a seal is never cut in
// half. Retries are new attempts; nothing leaves failed except release.
type AttemptState string

// The attempt states of the spec.
const (
	AttemptQueued    AttemptState = "queued"
	AttemptActive    AttemptState = "active"
	AttemptQuiescing AttemptState = "quiescing"
	AttemptSealed    AttemptState = "sealed"
	AttemptFailed    AttemptState = "failed"
	AttemptReleased  AttemptState = "released"
)

// AttemptStates lists every state in lifecycle order.
var AttemptStates = []AttemptState{AttemptQueued, AttemptActive, AttemptQuiescing, AttemptSealed, AttemptFailed, AttemptReleased}

var attemptTransitions = map[AttemptState][]AttemptState{
	AttemptQueued:    {AttemptActive, AttemptFailed, AttemptReleased},
	AttemptActive:    {AttemptQuiescing, AttemptFailed, AttemptReleased},
	AttemptQuiescing: {AttemptActive, AttemptSealed, AttemptFailed},
	AttemptSealed:    {AttemptReleased},
	AttemptFailed:    {AttemptReleased},
}

// Valid reports whether s is one of AttemptStates.
func (s AttemptState) Valid() bool { return contains(AttemptStates, s) }

// CanTransition reports whether an attempt may go from s to to.
func (s AttemptState) CanTransition(to AttemptState) bool {
	return contains(attemptTransitions[s], to)
}

// Live reports whether an attempt in s may still hold a lease and a delta.
func (s AttemptState) Live() bool {
	return s == AttemptQueued || s == AttemptActive || s == AttemptQuiescing
}

// Transition moves n to status to, or returns an error wrapping
// ErrFailedPrecondition (illegal move) or ErrInvalidArgument (unknown status)
// and leaves n unchanged.
func (n *Node) Transition(to NodeStatus) error {
	if !to.Valid() {
		return fmt.Errorf("node %s: unknown status %q: %w", n.NodeID, to, ErrInvalidArgument)
	}
	if !n.Status.CanTransition(to) {
		return fmt.Errorf("node %s is %s, cannot become %s: %w", n.NodeID, n.Status, to, ErrFailedPrecondition)
	}
	n.Status = to
	return nil
}

// Transition moves a to state to, or returns an error wrapping
// ErrFailedPrecondition (illegal move) or ErrInvalidArgument (unknown state)
// and leaves a unchanged.
func (a *Attempt) Transition(to AttemptState) error {
	if !to.Valid() {
		return fmt.Errorf("attempt %s: unknown state %q: %w", a.AttemptID, to, ErrInvalidArgument)
	}
	if !a.State.CanTransition(to) {
		return fmt.Errorf("attempt %s is %s, cannot become %s: %w", a.AttemptID, a.State, to, ErrFailedPrecondition)
	}
	a.State = to
	return nil
}

func contains[T comparable](list []T, v T) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
