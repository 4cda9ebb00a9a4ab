package journal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// The durable records. JSON field names are the spec's. No record holds a
// worker-local path, inode number or mount id as identity: those live in
// AttemptRuntime, which recovery may rebuild or discard.

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
	// Name, if set, is unique among the graph's groups and never changes
	// (CheckGroupName): what people and E2B templateIDs call the group.
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
	// Labels are the caller's data about the attempt (for example an E2B
	// sandbox's metadata), kept with it so the provenance of every node it
	// seals carries them. At most MaxLabels.
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
}

// MaxLabels bounds an attempt's labels.
const MaxLabels = 64

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

// Expired reports whether l has expired at now.
func (l Lease) Expired(now time.Time) bool { return !now.Before(l.ExpiresAt) }

// IdempotencyEntry is the first result of a mutating operation under a key.
// A result of up to InlineResultSize bytes is kept in the entry; a larger
// one is stored in parts beside it (ResultParts, ResultSize and
// ResultDigest describe them, and Result is empty in the stored record).
// GetIdempotency returns the entry with Result whole either way.
type IdempotencyEntry struct {
	Key string `json:"key"`
	Op  string `json:"op"`
	// Fingerprint is "sha256:" and the hex SHA-256 of the op and the
	// canonical JSON of the request (see Fingerprint).
	Fingerprint string          `json:"fingerprint"`
	Result      json.RawMessage `json:"result,omitempty"`
	// ResultParts is the number of parts of a result stored beside the
	// entry, ResultSize its length and ResultDigest its "sha256:" digest.
	ResultParts  int       `json:"result_parts,omitempty"`
	ResultSize   int64     `json:"result_size,omitempty"`
	ResultDigest string    `json:"result_digest,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	// ExpiresAt, if set, is when the entry may be deleted
	// (ExpireIdempotency); a zero time keeps it for ever.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// Limits on caller-supplied strings, so a record stays small.
const (
	maxNameLen = 256
	maxTextLen = 4096
)

// Validate checks g's fields; a violation wraps ErrInvalidArgument.
func (g *Group) Validate() error {
	return firstErr(
		CheckID(KindGroup, g.GroupID),
		CheckID(KindNode, g.RootNodeID),
		CheckID(KindNode, g.CanonicalNodeID),
		check(g.Generation >= 1, "group %s: generation must be at least 1", g.GroupID),
		checkJSON(g.Policy, "group %s: policy", g.GroupID),
		checkGroupName(g.Name, true),
	)
}

// CheckGroupName checks a group's name: 1..128 characters of [A-Za-z0-9._-]
// starting with a letter or digit, never shaped like an id ("node_..."), so
// that a name and an id cannot be confused. A violation wraps
// ErrInvalidArgument.
func CheckGroupName(name string) error { return checkGroupName(name, false) }

func checkGroupName(name string, emptyOK bool) error {
	if name == "" && emptyOK {
		return nil
	}
	if len(name) == 0 || len(name) > 128 {
		return fmt.Errorf("group name %q: want 1..128 characters: %w", name, ErrInvalidArgument)
	}
	for i, c := range []byte(name) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || (c != '.' && c != '_' && c != '-')) {
			return fmt.Errorf("group name %q: want letters, digits, '.', '_' and '-', starting with a letter or digit: %w", name, ErrInvalidArgument)
		}
	}
	if k, _, ok := strings.Cut(name, "_"); ok && Kind(k).valid() {
		return fmt.Errorf("group name %q: looks like an id: %w", name, ErrInvalidArgument)
	}
	return nil
}

// Validate checks n's fields; a violation wraps ErrInvalidArgument.
func (n *Node) Validate() error {
	if n.ok() {
		return nil
	}
	return n.explain()
}

// explain is Validate's error: which field is wrong (see valid.go).
func (n *Node) explain() error {
	if err := firstErr(
		CheckID(KindNode, n.NodeID),
		CheckID(KindGroup, n.GroupID),
		checkHexID(n.RootID, "node %s: root_id", n.NodeID),
		checkJSON(n.LogicalState, "node %s: logical_state", n.NodeID),
		check(n.Status.Valid(), "node %s: unknown status %q", n.NodeID, n.Status),
		checkFinite(n.Value, "node %s: value", n.NodeID),
		n.Provenance.validate(n.NodeID),
	); err != nil {
		return err
	}
	seen := make(map[string]bool, len(n.Parents))
	for _, p := range n.Parents {
		if err := CheckID(KindNode, p); err != nil {
			return fmt.Errorf("node %s: parent: %w", n.NodeID, err)
		}
		if p == n.NodeID || seen[p] {
			return fmt.Errorf("node %s: parent %s repeated or self: %w", n.NodeID, p, ErrInvalidArgument)
		}
		seen[p] = true
	}
	return nil
}

func (p *Provenance) validate(nodeID string) error {
	return firstErr(
		checkName(p.Op, "node %s: provenance op", nodeID),
		checkText(p.Source, "node %s: provenance source", nodeID),
		checkOptID(KindAttempt, p.AttemptID),
		checkText(p.Executor, "node %s: provenance executor", nodeID),
		checkJSON(p.Environment, "node %s: provenance environment", nodeID),
		checkText(p.IdempotencyKey, "node %s: provenance idempotency key", nodeID),
		checkText(p.TraceID, "node %s: provenance trace id", nodeID),
	)
}

// Validate checks a's fields; a violation wraps ErrInvalidArgument.
func (a *Attempt) Validate() error {
	return firstErr(
		CheckID(KindAttempt, a.AttemptID),
		CheckID(KindNode, a.NodeID),
		CheckID(KindGroup, a.GroupID),
		checkName(a.Executor, "attempt %s: executor", a.AttemptID),
		checkOptID(KindLease, a.LeaseID),
		check(a.State.Valid(), "attempt %s: unknown state %q", a.AttemptID, a.State),
		checkOptID(KindAttempt, a.RetryOf),
		checkOptID(KindNode, a.ResultNodeID),
		checkText(a.Error, "attempt %s: error", a.AttemptID),
		checkLabels(a.Labels, "attempt "+a.AttemptID),
	)
}

// checkLabels checks at most MaxLabels labels, keys names, values text.
func checkLabels(labels map[string]string, what string) error {
	if len(labels) > MaxLabels {
		return check(false, "%s: %d labels, at most %d", what, len(labels), MaxLabels)
	}
	for k, v := range labels {
		if err := firstErr(checkName(k, "%s: label key", what), checkText(v, "%s: label %q", what, k)); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks rt's fields; a violation wraps ErrInvalidArgument.
func (rt *AttemptRuntime) Validate() error {
	return firstErr(
		CheckID(KindAttempt, rt.AttemptID),
		checkName(rt.Worker, "attempt %s runtime: worker", rt.AttemptID),
		checkText(rt.PrivateDelta, "attempt %s runtime: private_delta", rt.AttemptID),
		checkText(rt.Mount, "attempt %s runtime: mount", rt.AttemptID),
		checkJSON(rt.Data, "attempt %s runtime: data", rt.AttemptID),
	)
}

// Validate checks e's fields; a violation wraps ErrInvalidArgument.
func (e *Evaluation) Validate() error {
	if e.ok() {
		return nil
	}
	return e.explain()
}

// explain is Validate's error: which field is wrong (see valid.go).
func (e *Evaluation) explain() error {
	if err := firstErr(
		CheckID(KindEvaluation, e.EvaluationID),
		CheckID(KindNode, e.NodeID),
		checkOptID(KindAttempt, e.AttemptID),
		CheckID(KindGroup, e.GroupID),
		checkName(e.Evaluator, "evaluation %s: evaluator", e.EvaluationID),
		checkName(e.EvaluatorVersion, "evaluation %s: evaluator_version", e.EvaluationID),
		checkFinite(e.Reward, "evaluation %s: reward", e.EvaluationID),
		checkText(e.Verdict, "evaluation %s: verdict", e.EvaluationID),
	); err != nil {
		return err
	}
	for _, id := range e.Evidence {
		if err := checkHexID(id, "evaluation %s: evidence", e.EvaluationID); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks l's fields; a violation wraps ErrInvalidArgument.
func (l *Lease) Validate() error {
	return firstErr(
		CheckID(KindLease, l.LeaseID),
		CheckID(KindAttempt, l.AttemptID),
		CheckID(KindNode, l.NodeID),
		CheckID(KindGroup, l.GroupID),
		check(l.Token > 0, "lease %s: token must be positive", l.LeaseID),
		check(l.TTLMillis > 0, "lease %s: ttl_ms must be positive", l.LeaseID),
		check(l.ExpiresAt.UnixNano() > 0, "lease %s: expires_at %v out of range", l.LeaseID, l.ExpiresAt),
	)
}

// Validate checks e's fields; a violation wraps ErrInvalidArgument.
func (e *IdempotencyEntry) Validate() error {
	if e.ok() {
		return nil
	}
	return e.explain()
}

// explain is Validate's error: which field is wrong (see valid.go).
func (e *IdempotencyEntry) explain() error {
	return firstErr(
		CheckIdempotencyKey(e.Key),
		checkName(e.Op, "idempotency key %q: op", e.Key),
		check(len(e.Fingerprint) == len("sha256:")+64, "idempotency key %q: malformed fingerprint", e.Key),
		e.checkResult(),
		check(e.ExpiresAt.IsZero() || e.ExpiresAt.After(e.CreatedAt), "idempotency key %q: expires before it was made", e.Key),
	)
}

func (e *IdempotencyEntry) checkResult() error {
	if e.ResultParts == 0 {
		return firstErr(
			check(e.ResultSize == 0 && e.ResultDigest == "", "idempotency key %q: result size or digest without parts", e.Key),
			check(len(e.Result) > 0 && json.Valid(e.Result), "idempotency key %q: result is not JSON", e.Key))
	}
	return firstErr(
		check(len(e.Result) == 0 || int64(len(e.Result)) == e.ResultSize, "idempotency key %q: result both inline and in parts", e.Key),
		check(e.ResultSize > InlineResultSize && e.ResultSize <= MaxResultSize, "idempotency key %q: result of %d bytes in parts", e.Key, e.ResultSize),
		check(int64(e.ResultParts) == (e.ResultSize+resultPartSize-1)/resultPartSize, "idempotency key %q: %d parts for %d bytes", e.Key, e.ResultParts, e.ResultSize),
		check(len(e.ResultDigest) == len("sha256:")+64 && strings.HasPrefix(e.ResultDigest, "sha256:"), "idempotency key %q: malformed result digest", e.Key))
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func check(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format+": %w", append(args, ErrInvalidArgument)...)
}

func checkOptID(k Kind, id string) error {
	if id == "" {
		return nil
	}
	return CheckID(k, id)
}

func checkJSON(b json.RawMessage, format string, args ...any) error {
	return check(len(b) == 0 || json.Valid(b), format+" is not valid JSON", args...)
}

func checkFinite(f float64, format string, args ...any) error {
	return check(!math.IsNaN(f) && !math.IsInf(f, 0), format+" must be finite", args...)
}

// checkName checks a required short identifier-like string.
func checkName(s, format string, args ...any) error {
	if s == "" {
		return check(false, format+" is required", args...)
	}
	return checkString(s, maxNameLen, format, args...)
}

func checkText(s, format string, args ...any) error {
	return checkString(s, maxTextLen, format, args...)
}

func checkString(s string, limit int, format string, args ...any) error {
	if len(s) > limit {
		return check(false, format+" longer than %d bytes", append(args, limit)...)
	}
	return check(utf8.ValidString(s), format+" is not UTF-8", args...)
}

// checkHexID checks a 64-digit lowercase hex CAS id without importing cas:
// the journal stays a leaf that knows ids only as names.
func checkHexID(s, format string, args ...any) error {
	ok := len(s) == 64
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = '0' <= c && c <= '9' || 'a' <= c && c <= 'f'
	}
	return check(ok, format+" %q is not a 64-digit hex object id", append(args, s)...)
}

// encode marshals a validated record.
func encode(what string, v interface{ Validate() error }) ([]byte, error) {
	if err := v.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %v: %w", what, err, ErrInvalidArgument)
	}
	if len(b) > MaxValueSize {
		return nil, fmt.Errorf("encode %s: %d bytes, limit %d: %w", what, len(b), MaxValueSize, ErrInvalidArgument)
	}
	return b, nil
}

// decode parses a stored record strictly: unknown fields, trailing data and
// invalid fields all mean the bytes are not what this version wrote, so they
// are ErrCorrupt rather than silently half-read.
func decode(what string, b []byte, v interface{ Validate() error }) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode %s: %v: %w", what, err, ErrCorrupt)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("decode %s: trailing data: %w", what, ErrCorrupt)
	}
	if err := v.Validate(); err != nil {
		return fmt.Errorf("decode %s: %v: %w", what, err, ErrCorrupt)
	}
	return nil
}
