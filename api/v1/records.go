package v1

import "time"

// NodeStatus is the status of a node: draft (an attempt may write it), sealed
// (immutable, forkable), terminal (a finished leaf) or pruned.
type NodeStatus string

// The node statuses.
const (
	NodeDraft    NodeStatus = "draft"
	NodeSealed   NodeStatus = "sealed"
	NodeTerminal NodeStatus = "terminal"
	NodePruned   NodeStatus = "pruned"
)

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

// The attempt states.
const (
	AttemptQueued    AttemptState = "queued"
	AttemptActive    AttemptState = "active"
	AttemptQuiescing AttemptState = "quiescing"
	AttemptSealed    AttemptState = "sealed"
	AttemptFailed    AttemptState = "failed"
	AttemptReleased  AttemptState = "released"
)

// Live reports whether an attempt in s may still hold a lease and a delta.
func (s AttemptState) Live() bool {
	return s == AttemptQueued || s == AttemptActive || s == AttemptQuiescing
}

// The types of the events GET /v1/events streams. Operations may add their
// own under the same "<record>.<what>" scheme.
const (
	EventGroupCreated      = "group.created"
	EventGroupPromoted     = "group.promoted"
	EventNodeCreated       = "node.created" // a group's root node
	EventNodeForked        = "node.forked"
	EventNodeState         = "node.state" // data: {"from": ..., "to": ...}
	EventNodeBackprop      = "node.backprop"
	EventAttemptCreated    = "attempt.created"
	EventAttemptState      = "attempt.state" // data: {"from": ..., "to": ...}
	EventEvaluationCreated = "evaluation.created"
	EventLeaseAcquired     = "lease.acquired"
	EventLeaseRenewed      = "lease.renewed"
	EventLeaseExpired      = "lease.expired"
	EventLeaseReleased     = "lease.released"
)

// Kind is the prefix that names what an id identifies: an id is
// "<kind>_<suffix>".
type Kind string

// The kinds of ids.
const (
	KindGroup      Kind = "grp"
	KindNode       Kind = "node"
	KindAttempt    Kind = "att"
	KindEvaluation Kind = "eval"
	KindLease      Kind = "lease"
)

// Executors an attempt can run with (ActivateRequest.Executor).
const (
	ExecutorNone = "none"
	ExecutorRunc = "runc"
	ExecutorWASI = "wasi"
)

// DefaultLeaseTTL is the lease an activation takes when it names none.
const DefaultLeaseTTL = 10 * time.Minute

// MaxFork bounds the children one fork creates.
const MaxFork = 10_000

// MaxDroppedPaths bounds Dropped.Paths.
const MaxDroppedPaths = 100
