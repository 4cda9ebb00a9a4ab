package v1

import (
	"encoding/json"
	"time"
)

// The graph: groups, nodes, their evaluations, and the views of them.

// CreateGroupRequest creates a group from a stored root.
type CreateGroupRequest struct {
	RootID       string          `json:"root_id"`
	Source       string          `json:"source,omitempty"` // what was imported, for humans
	Policy       json.RawMessage `json:"policy,omitempty"`
	LogicalState json.RawMessage `json:"logical_state,omitempty"`
	// Name, if set, names the group: unique in the graph (conflicts are
	// already_exists), and usable where a group id is (E2B templateIDs).
	Name string `json:"name,omitempty"`
}

// CreateGroupResult is the new group and its sealed root node.
type CreateGroupResult struct {
	Group Group `json:"group"`
	Node  Node  `json:"node"`
}

// ForkRequest asks for N draft children of a sealed node.
type ForkRequest struct {
	NodeID string `json:"node_id"`
	N      int    `json:"n"`
	// LogicalState of the children; the parent's when absent.
	LogicalState json.RawMessage `json:"logical_state,omitempty"`
}

// ForkResult lists the new drafts.
type ForkResult struct {
	Nodes []Node `json:"nodes"`
}

// PromoteRequest moves a group's canonical node by compare-and-swap.
type PromoteRequest struct {
	GroupID            string `json:"group_id"`
	NodeID             string `json:"node_id"`
	ExpectedGeneration uint64 `json:"expected_generation"`
}

// EvaluateRequest attaches versioned evidence and a decision to a sealed
// result.
type EvaluateRequest struct {
	// Target is a node id, or an attempt id (its result node).
	Target string `json:"target"`
	// Evaluator is "name@version".
	Evaluator string  `json:"evaluator"`
	Reward    float64 `json:"reward"`
	Verdict   string  `json:"verdict"`
	// Evidence holds hex ids of objects already stored (the API uploads them
	// through POST /v1/evidence first).
	Evidence []string `json:"evidence,omitempty"`
	Terminal bool     `json:"terminal,omitempty"`
	Backprop bool     `json:"backprop,omitempty"`
}

// PruneRequest marks a subtree pruned.
type PruneRequest struct {
	NodeID string `json:"node_id"`
}

// PruneResult lists the nodes that became pruned.
type PruneResult struct {
	Pruned []string `json:"pruned"`
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
	Node  Node   `json:"node"`
	Base  string `json:"base"`
	Group *Group `json:"group,omitempty"`
}

// Inspection is the answer of inspect: exactly one field is set.
type Inspection struct {
	Kind    string       `json:"kind"`
	Group   *GroupView   `json:"group,omitempty"`
	Node    *NodeView    `json:"node,omitempty"`
	Attempt *AttemptView `json:"attempt,omitempty"`
}

// GroupView is a group with its size.
type GroupView struct {
	Group
	Nodes int `json:"nodes"`
}

// NodeView is a node with what inspect shows around it.
type NodeView struct {
	Node
	// Ancestry lists the ancestors nearest first, ending at the group root.
	Ancestry    []string     `json:"ancestry"`
	Children    []string     `json:"children"`
	Attempts    []string     `json:"attempts"`
	Leases      []Lease      `json:"leases"`
	Evaluations []Evaluation `json:"evaluations"`
}

// AttemptView is an attempt with its lease and, on this worker, its runtime.
type AttemptView struct {
	Attempt
	Lease   *Lease          `json:"lease,omitempty"`
	Runtime *AttemptRuntime `json:"runtime,omitempty"`
	// Root is where the attempt's writable root is mounted on this worker.
	Root string `json:"root,omitempty"`
}

// TreeView is a whole group graph, nodes in creation order.
type TreeView struct {
	Group Group  `json:"group"`
	Nodes []Node `json:"nodes"`
}

// Group owns one checkpoint graph and its canonical generation.
type Group struct {
	GroupID string `json:"group_id"`
	// RootNodeID is the node the group was created from: the root of
	// `tree`. It never changes.
	RootNodeID      string `json:"root_node_id"`
	CanonicalNodeID string `json:"canonical_node_id"`
	// Generation starts at 1 and only grows; promote advances it by
	// compare-and-swap.
	Generation uint64          `json:"generation"`
	Policy     json.RawMessage `json:"policy,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	// Name, if set, is unique among the graph's groups and never changes:
	// what people and E2B templateIDs call the group.
	Name string `json:"name,omitempty"`
}

// Node is a selectable checkpoint: a root tree in the CAS plus logical state.
type Node struct {
	NodeID  string `json:"node_id"`
	GroupID string `json:"group_id"`
	// Parents is empty for a group's root node; a fork has one parent, a
	// merge several. Never changes.
	Parents []string `json:"parents"`
	// RootID is the hex id of the root tree object. A draft carries its
	// parent's root; sealing fixes the node's own.
	RootID       string          `json:"root_id"`
	LogicalState json.RawMessage `json:"logical_state,omitempty"`
	Status       NodeStatus      `json:"status"`
	Provenance   Provenance      `json:"provenance"`
	// Visits and Value are MCTS statistics: evaluations backpropagated
	// through this node, and the sum of their rewards.
	Visits    uint64    `json:"visits"`
	Value     float64   `json:"value"`
	CreatedAt time.Time `json:"created_at"`
}

// Provenance says how a node's content came to be (FR-10). Parents, group
// policy and evaluations live on their own records.
type Provenance struct {
	// Op is the operation that made the node: create_group, fork, seal, merge.
	Op string `json:"op"`
	// Source is what create_group imported, as the user named it. It is a
	// description for humans, never an identity.
	Source string `json:"source,omitempty"`
	// AttemptID is the attempt whose seal produced the node's content.
	AttemptID string `json:"attempt_id,omitempty"`
	Executor  string `json:"executor,omitempty"`
	// Environment pins what the attempt ran with: base image or module,
	// network and secrets policy, resource limits.
	Environment    json.RawMessage `json:"environment,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	TraceID        string          `json:"trace_id,omitempty"`
}

// Attempt is one disposable activation of a node on one backend.
type Attempt struct {
	AttemptID string `json:"attempt_id"`
	NodeID    string `json:"node_id"`
	GroupID   string `json:"group_id"`
	// Executor names the backend: runc, wasi or none.
	Executor string       `json:"executor"`
	LeaseID  string       `json:"lease_id,omitempty"`
	State    AttemptState `json:"state"`
	// RetryOf is the failed attempt this one retries; that record is never
	// rewritten.
	RetryOf string `json:"retry_of,omitempty"`
	// ResultNodeID is the node the last successful seal committed.
	ResultNodeID string `json:"result_node_id,omitempty"`
	Error        string `json:"error,omitempty"`
	// Labels are the caller's data kept with the attempt (an E2B
	// sandbox's metadata, for example).
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
}

// AttemptRuntime is the worker-local side of an attempt: where its private
// delta and mount live on one machine. It is not identity; recovery on
// another worker ignores it, and it may be deleted when the attempt is
// released.
type AttemptRuntime struct {
	AttemptID    string          `json:"attempt_id"`
	Worker       string          `json:"worker"`
	PrivateDelta string          `json:"private_delta,omitempty"`
	Mount        string          `json:"mount,omitempty"`
	Data         json.RawMessage `json:"data,omitempty"`
	UpdatedAt    time.Time       `json:"updated_at"`
}

// Lease is a live claim of an attempt on a node. Its record exists only while
// the lease is held; releasing or expiring it deletes the record.
type Lease struct {
	LeaseID   string `json:"lease_id"`
	AttemptID string `json:"attempt_id"`
	NodeID    string `json:"node_id"`
	GroupID   string `json:"group_id"`
	// Token is the fencing token: drawn from NextFencingToken, so every
	// lease ever granted by the store has a larger one than the last.
	Token     uint64    `json:"token"`
	TTLMillis int64     `json:"ttl_ms"`
	ExpiresAt time.Time `json:"expires_at"`
	CreatedAt time.Time `json:"created_at"`
}

// Evaluation is versioned evidence and a decision for one sealed result. It
// is immutable: a re-evaluation is a new record.
type Evaluation struct {
	EvaluationID     string  `json:"evaluation_id"`
	NodeID           string  `json:"node_id"`
	AttemptID        string  `json:"attempt_id,omitempty"`
	GroupID          string  `json:"group_id"`
	Evaluator        string  `json:"evaluator"`
	EvaluatorVersion string  `json:"evaluator_version"`
	Reward           float64 `json:"reward"`
	Verdict          string  `json:"verdict"`
	// Evidence lists the hex CAS ids of the evidence objects.
	Evidence  []string  `json:"evidence,omitempty"`
	Terminal  bool      `json:"terminal"`
	Backprop  bool      `json:"backprop"`
	CreatedAt time.Time `json:"created_at"`
}

// Event is one entry of the append-only log: a transition, correlated with
// the ids the spec's trace audit asks for. Events are written by
// Tx.AppendEvent in the same batch as the transition they describe, so the
// log never shows a transition that did not commit, nor misses one that did.
type Event struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Type is "<record>.<what>", e.g. "node.forked", "attempt.state".
	Type      string `json:"type"`
	GroupID   string `json:"group_id,omitempty"`
	NodeID    string `json:"node_id,omitempty"`
	AttemptID string `json:"attempt_id,omitempty"`
	RootID    string `json:"root_id,omitempty"`
	LeaseID   string `json:"lease_id,omitempty"`
	// TraceID and SpanID are the W3C trace context of the operation (32
	// and 16 hex digits); ParentSpanID is the caller's span, if any.
	TraceID        string          `json:"trace_id,omitempty"`
	SpanID         string          `json:"span_id,omitempty"`
	ParentSpanID   string          `json:"parent_span_id,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Data           json.RawMessage `json:"data,omitempty"`
}

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
