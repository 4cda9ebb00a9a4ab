package journal

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Typed access to the records. Every Create/Update helper validates the
// record, checks the references it makes and the fields that may not change,
// and maintains the record's index keys in the same transaction, so an index
// never names a record that is absent. None of them appends events: the
// operation that calls them (fabric) knows the trace context and emits one
// event per transition in the same Update.

func getRecord(r Reader, what, id string, key []byte, v interface{ Validate() error }) error {
	b, err := r.Get(key)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%s %s: %w", what, id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	return decode(what+" "+id, b, v)
}

func exists(r Reader, key []byte) (bool, error) {
	_, err := r.Get(key)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

func putRecord(tx Tx, what string, key []byte, v interface{ Validate() error }) error {
	b, err := encode(what, v)
	if err != nil {
		return err
	}
	return tx.Put(key, b)
}

func mustBeNew(tx Tx, what, id string, key []byte) error {
	ok, err := exists(tx, key)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	if ok {
		return fmt.Errorf("%s %s: %w", what, id, ErrExists)
	}
	return nil
}

func immutable(what, id, field string, same bool) error {
	if same {
		return nil
	}
	return fmt.Errorf("%s %s: %s cannot change: %w", what, id, field, ErrInvalidArgument)
}

func orNow(t time.Time, r Reader) time.Time {
	if t.IsZero() {
		return r.Now()
	}
	return t
}

// GetGroup reads group id.
func GetGroup(r Reader, id string) (Group, error) {
	var g Group
	if err := CheckID(KindGroup, id); err != nil {
		return g, err
	}
	err := getRecord(r, "group", id, recordKey(prefixGroup, id), &g)
	return g, err
}

// GroupByName finds the group named name (ErrNotFound if none). Names are
// few and looked up rarely: it scans the groups.
func GroupByName(r Reader, name string) (Group, error) {
	if err := CheckGroupName(name); err != nil {
		return Group{}, err
	}
	var found Group
	errFound := errors.New("found")
	err := Groups(r, func(g Group) error {
		if g.Name == name {
			found = g
			return errFound
		}
		return nil
	})
	if err == errFound {
		return found, nil
	}
	if err != nil {
		return Group{}, err
	}
	return Group{}, fmt.Errorf("group named %q: %w", name, ErrNotFound)
}

// CreateGroup stores a new group (ErrExists if its id, or its name, is
// taken). A zero
// CreatedAt becomes tx.Now(). The group's nodes may be created after it in
// the same transaction; the caller must create RootNodeID there.
func CreateGroup(tx Tx, g Group) error {
	key := recordKey(prefixGroup, g.GroupID)
	if err := g.Validate(); err != nil {
		return err
	}
	if err := mustBeNew(tx, "group", g.GroupID, key); err != nil {
		return err
	}
	if g.Name != "" {
		if other, err := GroupByName(tx, g.Name); err == nil {
			return fmt.Errorf("group name %q is taken by %s: %w", g.Name, other.GroupID, ErrExists)
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	g.CreatedAt = orNow(g.CreatedAt, tx)
	return putRecord(tx, "group", key, &g)
}

// UpdateGroup rewrites an existing group (ErrNotFound if absent). RootNodeID
// and CreatedAt never change (ErrInvalidArgument); the generation never goes
// back (ErrStaleGeneration); the canonical node must exist in the group.
// Promote's compare of the expected generation is the caller's, done in the
// same transaction.
func UpdateGroup(tx Tx, g Group) error {
	old, err := GetGroup(tx, g.GroupID)
	if err != nil {
		return err
	}
	if err := g.Validate(); err != nil {
		return err
	}
	if err := firstErr(
		immutable("group", g.GroupID, "root_node_id", g.RootNodeID == old.RootNodeID),
		immutable("group", g.GroupID, "name", g.Name == old.Name),
		immutable("group", g.GroupID, "created_at", g.CreatedAt.Equal(old.CreatedAt)),
	); err != nil {
		return err
	}
	if g.Generation < old.Generation {
		return fmt.Errorf("group %s: generation %d is older than stored %d: %w", g.GroupID, g.Generation, old.Generation, ErrStaleGeneration)
	}
	if g.CanonicalNodeID != old.CanonicalNodeID {
		n, err := GetNode(tx, g.CanonicalNodeID)
		if err != nil {
			return fmt.Errorf("group %s: canonical: %w", g.GroupID, err)
		}
		if n.GroupID != g.GroupID {
			return fmt.Errorf("group %s: canonical node %s belongs to group %s: %w", g.GroupID, n.NodeID, n.GroupID, ErrInvalidArgument)
		}
	}
	return putRecord(tx, "group", recordKey(prefixGroup, g.GroupID), &g)
}

// Groups calls fn for every group, oldest first.
func Groups(r Reader, fn func(Group) error) error {
	return scanRecords(r, prefixGroup, "group", fn)
}

// Nodes calls fn for every node of every group, in id order (a whole-graph
// scan: GC and audits, never a per-operation path).
func Nodes(r Reader, fn func(Node) error) error {
	return scanRecords(r, prefixNode, "node", fn)
}

// Attempts calls fn for every attempt, in id (creation) order.
func Attempts(r Reader, fn func(Attempt) error) error {
	return scanRecords(r, prefixAttempt, "attempt", fn)
}

// Evaluations calls fn for every evaluation, in id order.
func Evaluations(r Reader, fn func(Evaluation) error) error {
	return scanRecords(r, prefixEval, "evaluation", fn)
}

func scanRecords[T any, P interface {
	*T
	Validate() error
}](r Reader, prefix, what string, fn func(T) error) error {
	return ScanPrefix(r, []byte(prefix), func(k, v []byte) error {
		var rec T
		if err := decode(what+" "+string(k[len(prefix):]), v, P(&rec)); err != nil {
			return err
		}
		return fn(rec)
	})
}

// GetNode reads node id.
func GetNode(r Reader, id string) (Node, error) {
	var n Node
	if err := CheckID(KindNode, id); err != nil {
		return n, err
	}
	err := getRecord(r, "node", id, recordKey(prefixNode, id), &n)
	return n, err
}

// GetNodeJSON reads a node's record as stored: the JSON of Node (records
// are encoded by encode, and a change of that encoding is a SchemaVersion
// change), checked only for being JSON. It is for answers that list many
// nodes as they are (the tree of a 10,000-node group): decoding each
// record only to encode it again was most of their cost. Anything that
// acts on a node uses GetNode.
func GetNodeJSON(r Reader, id string) (json.RawMessage, error) {
	if err := CheckID(KindNode, id); err != nil {
		return nil, err
	}
	b, err := r.Get(recordKey(prefixNode, id))
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("node %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", id, err)
	}
	if !json.Valid(b) || len(b) == 0 || b[0] != '{' {
		return nil, fmt.Errorf("decode node %s: not a JSON object: %w", id, ErrCorrupt)
	}
	return b, nil
}

// CreateNode stores a new node (ErrExists if its id is taken) and its
// parentage and group index keys. Its group and every parent must exist
// (ErrNotFound), and the parents must belong to the same group
// (ErrInvalidArgument). A zero CreatedAt becomes tx.Now(). The cost is a
// constant number of small reads and writes per parent, whatever the size of
// the graph: fork stays O(1).
func CreateNode(tx Tx, n Node) error { return createNode(tx, n, nil) }

// CreateChild is CreateNode of a node whose only parent is parent, which
// the caller read with GetNode in the same transaction (fork): the parent
// is not read and decoded a second time.
func CreateChild(tx Tx, n Node, parent Node) error {
	if len(n.Parents) != 1 || n.Parents[0] != parent.NodeID {
		return fmt.Errorf("node %s: parents %v, want just %s: %w", n.NodeID, n.Parents, parent.NodeID, ErrInvalidArgument)
	}
	return createNode(tx, n, &parent)
}

// createNode is CreateNode; read, if not nil, is its only parent as this
// transaction read it.
func createNode(tx Tx, n Node, read *Node) error {
	if n.Parents == nil {
		n.Parents = []string{} // a root node lists no parents, not null
	}
	key := recordKey(prefixNode, n.NodeID)
	if err := n.Validate(); err != nil {
		return err
	}
	if err := mustBeNew(tx, "node", n.NodeID, key); err != nil {
		return err
	}
	if ok, err := exists(tx, recordKey(prefixGroup, n.GroupID)); err != nil || !ok {
		return fmt.Errorf("node %s: group %s: %w", n.NodeID, n.GroupID, orErr(err, ErrNotFound))
	}
	for _, pid := range n.Parents {
		var p Node
		var err error
		if read != nil {
			p = *read
		} else if p, err = GetNode(tx, pid); err != nil {
			return fmt.Errorf("node %s: parent: %w", n.NodeID, err)
		}
		if p.GroupID != n.GroupID {
			return fmt.Errorf("node %s in group %s: parent %s is in group %s: %w", n.NodeID, n.GroupID, pid, p.GroupID, ErrInvalidArgument)
		}
		if err := tx.Put(indexKey(prefixChildren, pid, n.NodeID), nil); err != nil {
			return err
		}
	}
	if err := tx.Put(indexKey(prefixGroupNodes, n.GroupID, n.NodeID), nil); err != nil {
		return err
	}
	n.CreatedAt = orNow(n.CreatedAt, tx)
	return putRecord(tx, "node", key, &n)
}

func orErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// UpdateNode rewrites an existing node (ErrNotFound if absent). A status
// change must be a legal transition (ErrFailedPrecondition). GroupID,
// Parents and CreatedAt never change; RootID, LogicalState and Provenance
// change only while the stored node is a draft, i.e. in the update that
// seals it (ErrInvalidArgument otherwise). Visits and Value are free.
func UpdateNode(tx Tx, n Node) error {
	old, err := GetNode(tx, n.NodeID)
	if err != nil {
		return err
	}
	return updateNode(tx, old, n)
}

// UpdateReadNode is UpdateNode of a node whose stored record, old, the
// caller read in this transaction (and has not written since): it is not
// read and decoded again (backprop updates every ancestor it reads).
func UpdateReadNode(tx Tx, old, n Node) error {
	if old.NodeID != n.NodeID {
		return fmt.Errorf("update node %s from the record of %s: %w", n.NodeID, old.NodeID, ErrInvalidArgument)
	}
	return updateNode(tx, old, n)
}

func updateNode(tx Tx, old, n Node) error {
	if err := n.Validate(); err != nil {
		return err
	}
	draft := old.Status == NodeDraft
	// The messages are built only for a field that changed: a backprop
	// updates every ancestor of the node it evaluates.
	for _, c := range []struct {
		field  string
		frozen bool // only once the node is no longer a draft
		same   bool
	}{
		{"group_id", false, n.GroupID == old.GroupID},
		{"parents", false, slices.Equal(n.Parents, old.Parents)},
		{"created_at", false, n.CreatedAt.Equal(old.CreatedAt)},
		{"root_id", true, draft || n.RootID == old.RootID},
		{"logical_state", true, draft || bytes.Equal(n.LogicalState, old.LogicalState)},
		{"provenance", true, draft || provenanceEqual(n.Provenance, old.Provenance)},
	} {
		if c.same {
			continue
		}
		if c.frozen {
			return immutable("node", n.NodeID, c.field+" of a "+string(old.Status)+" node", false)
		}
		return immutable("node", n.NodeID, c.field, false)
	}
	if n.Status != old.Status && !old.Status.CanTransition(n.Status) {
		return fmt.Errorf("node %s is %s, cannot become %s: %w", n.NodeID, old.Status, n.Status, ErrFailedPrecondition)
	}
	return putRecord(tx, "node", recordKey(prefixNode, n.NodeID), &n)
}

func provenanceEqual(a, b Provenance) bool {
	if a.Op == b.Op && a.Source == b.Source && a.AttemptID == b.AttemptID && a.Executor == b.Executor &&
		bytes.Equal(a.Environment, b.Environment) && a.IdempotencyKey == b.IdempotencyKey && a.TraceID == b.TraceID {
		return true // the same bytes: no need to compare their JSON
	}
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

// ChildrenOf lists the ids of the nodes that name id as a parent, oldest
// first. A node with no children, or no such node, gives an empty list.
func ChildrenOf(r Reader, nodeID string) ([]string, error) {
	return listMembers(r, prefixChildren, nodeID)
}

// NodesOfGroup calls fn with the id of every node of a group, oldest first,
// without loading the records: a group may hold a million nodes.
func NodesOfGroup(r Reader, groupID string, fn func(nodeID string) error) error {
	return scanMembers(r, prefixGroupNodes, groupID, fn)
}

// Ancestors calls fn for every ancestor of nodeID once, nearest first
// (breadth-first over parents, so a merge's shared ancestors are visited
// once), ending at the group's root. It does not visit nodeID itself.
func Ancestors(r Reader, nodeID string, fn func(Node) error) error {
	n, err := GetNode(r, nodeID)
	if err != nil {
		return err
	}
	return AncestorsOf(r, n, fn)
}

// AncestorsOf is Ancestors of a node the caller has read already.
func AncestorsOf(r Reader, n Node, fn func(Node) error) error {
	nodeID := n.NodeID
	seen := map[string]bool{nodeID: true}
	queue := append([]string(nil), n.Parents...)
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		if seen[id] {
			continue
		}
		seen[id] = true
		a, err := GetNode(r, id)
		if err != nil {
			return fmt.Errorf("ancestor of %s: %w", nodeID, err)
		}
		if err := fn(a); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
		queue = append(queue, a.Parents...)
	}
	return nil
}

// GetAttempt reads attempt id.
func GetAttempt(r Reader, id string) (Attempt, error) {
	var a Attempt
	if err := CheckID(KindAttempt, id); err != nil {
		return a, err
	}
	err := getRecord(r, "attempt", id, recordKey(prefixAttempt, id), &a)
	return a, err
}

// CreateAttempt stores a new attempt (ErrExists if taken) of an existing
// node of the same group (ErrNotFound, ErrInvalidArgument) and its index key.
// Zero CreatedAt and UpdatedAt become tx.Now().
func CreateAttempt(tx Tx, a Attempt) error {
	key := recordKey(prefixAttempt, a.AttemptID)
	if err := a.Validate(); err != nil {
		return err
	}
	if err := mustBeNew(tx, "attempt", a.AttemptID, key); err != nil {
		return err
	}
	n, err := GetNode(tx, a.NodeID)
	if err != nil {
		return fmt.Errorf("attempt %s: %w", a.AttemptID, err)
	}
	if n.GroupID != a.GroupID {
		return fmt.Errorf("attempt %s in group %s: node %s is in group %s: %w", a.AttemptID, a.GroupID, n.NodeID, n.GroupID, ErrInvalidArgument)
	}
	if err := tx.Put(indexKey(prefixNodeAttempts, a.NodeID, a.AttemptID), nil); err != nil {
		return err
	}
	a.CreatedAt = orNow(a.CreatedAt, tx)
	a.UpdatedAt = orNow(a.UpdatedAt, tx)
	return putRecord(tx, "attempt", key, &a)
}

// UpdateAttempt rewrites an existing attempt (ErrNotFound if absent). A state
// change must be a legal transition (ErrFailedPrecondition); NodeID, GroupID,
// Executor, RetryOf and CreatedAt never change (ErrInvalidArgument).
// UpdatedAt becomes tx.Now().
func UpdateAttempt(tx Tx, a Attempt) error {
	old, err := GetAttempt(tx, a.AttemptID)
	if err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return err
	}
	if err := firstErr(
		immutable("attempt", a.AttemptID, "node_id", a.NodeID == old.NodeID),
		immutable("attempt", a.AttemptID, "group_id", a.GroupID == old.GroupID),
		immutable("attempt", a.AttemptID, "executor", a.Executor == old.Executor),
		immutable("attempt", a.AttemptID, "retry_of", a.RetryOf == old.RetryOf),
		immutable("attempt", a.AttemptID, "created_at", a.CreatedAt.Equal(old.CreatedAt)),
	); err != nil {
		return err
	}
	if a.State != old.State && !old.State.CanTransition(a.State) {
		return fmt.Errorf("attempt %s is %s, cannot become %s: %w", a.AttemptID, old.State, a.State, ErrFailedPrecondition)
	}
	a.UpdatedAt = tx.Now()
	return putRecord(tx, "attempt", recordKey(prefixAttempt, a.AttemptID), &a)
}

// AttemptsOfNode lists the attempt ids of a node, oldest first.
func AttemptsOfNode(r Reader, nodeID string) ([]string, error) {
	return listMembers(r, prefixNodeAttempts, nodeID)
}

// GetAttemptRuntime reads the worker-local record of an attempt.
func GetAttemptRuntime(r Reader, attemptID string) (AttemptRuntime, error) {
	var rt AttemptRuntime
	if err := CheckID(KindAttempt, attemptID); err != nil {
		return rt, err
	}
	err := getRecord(r, "attempt runtime", attemptID, recordKey(prefixRuntime, attemptID), &rt)
	return rt, err
}

// AttemptRuntimes calls fn for every attempt runtime record (the live and
// queued attempts, with the worker that owns each), in attempt id order.
func AttemptRuntimes(r Reader, fn func(AttemptRuntime) error) error {
	return scanRecords(r, prefixRuntime, "attempt runtime", fn)
}

// PutAttemptRuntime creates or replaces the runtime record of an existing
// attempt (ErrNotFound). UpdatedAt becomes tx.Now().
func PutAttemptRuntime(tx Tx, rt AttemptRuntime) error {
	if err := rt.Validate(); err != nil {
		return err
	}
	if ok, err := exists(tx, recordKey(prefixAttempt, rt.AttemptID)); err != nil || !ok {
		return fmt.Errorf("attempt runtime: attempt %s: %w", rt.AttemptID, orErr(err, ErrNotFound))
	}
	rt.UpdatedAt = tx.Now()
	return putRecord(tx, "attempt runtime", recordKey(prefixRuntime, rt.AttemptID), &rt)
}

// DeleteAttemptRuntime removes the runtime record; a missing one is fine.
func DeleteAttemptRuntime(tx Tx, attemptID string) error {
	if err := CheckID(KindAttempt, attemptID); err != nil {
		return err
	}
	return tx.Delete(recordKey(prefixRuntime, attemptID))
}

// GetEvaluation reads evaluation id.
func GetEvaluation(r Reader, id string) (Evaluation, error) {
	var e Evaluation
	if err := CheckID(KindEvaluation, id); err != nil {
		return e, err
	}
	err := getRecord(r, "evaluation", id, recordKey(prefixEval, id), &e)
	return e, err
}

// CreateEvaluation stores a new, immutable evaluation (ErrExists if taken)
// of an existing node, and of one of that node's attempts if AttemptID is
// set (ErrNotFound, ErrInvalidArgument), with its index keys. A zero
// CreatedAt becomes tx.Now(). There is no update: a re-evaluation is a new
// record, so evidence is never rewritten.
func CreateEvaluation(tx Tx, e Evaluation) error {
	key := recordKey(prefixEval, e.EvaluationID)
	if err := e.Validate(); err != nil {
		return err
	}
	if err := mustBeNew(tx, "evaluation", e.EvaluationID, key); err != nil {
		return err
	}
	n, err := GetNode(tx, e.NodeID)
	if err != nil {
		return fmt.Errorf("evaluation %s: %w", e.EvaluationID, err)
	}
	if n.GroupID != e.GroupID {
		return fmt.Errorf("evaluation %s in group %s: node %s is in group %s: %w", e.EvaluationID, e.GroupID, n.NodeID, n.GroupID, ErrInvalidArgument)
	}
	if e.AttemptID != "" {
		a, err := GetAttempt(tx, e.AttemptID)
		if err != nil {
			return fmt.Errorf("evaluation %s: %w", e.EvaluationID, err)
		}
		if a.NodeID != e.NodeID && a.ResultNodeID != e.NodeID {
			return fmt.Errorf("evaluation %s of node %s: attempt %s neither ran on nor produced it: %w", e.EvaluationID, e.NodeID, a.AttemptID, ErrInvalidArgument)
		}
		if err := tx.Put(indexKey(prefixAttemptEvals, e.AttemptID, e.EvaluationID), nil); err != nil {
			return err
		}
	}
	if err := tx.Put(indexKey(prefixNodeEvals, e.NodeID, e.EvaluationID), nil); err != nil {
		return err
	}
	e.CreatedAt = orNow(e.CreatedAt, tx)
	return putRecord(tx, "evaluation", key, &e)
}

// EvaluationsOfNode lists the evaluation ids of a node, oldest first.
func EvaluationsOfNode(r Reader, nodeID string) ([]string, error) {
	return listMembers(r, prefixNodeEvals, nodeID)
}

// EvaluationsOfAttempt lists the evaluation ids of an attempt, oldest first.
func EvaluationsOfAttempt(r Reader, attemptID string) ([]string, error) {
	return listMembers(r, prefixAttemptEvals, attemptID)
}

// GetLease reads lease id. A released or expired-and-reaped lease is
// ErrNotFound.
func GetLease(r Reader, id string) (Lease, error) {
	var l Lease
	if err := CheckID(KindLease, id); err != nil {
		return l, err
	}
	err := getRecord(r, "lease", id, recordKey(prefixLease, id), &l)
	return l, err
}

// CreateLease stores a new lease (ErrExists if taken) of an existing attempt
// on its node (ErrNotFound, ErrInvalidArgument) with its node and expiry
// index keys. Draw Token from NextFencingToken in the same transaction. A
// zero CreatedAt becomes tx.Now().
func CreateLease(tx Tx, l Lease) error {
	key := recordKey(prefixLease, l.LeaseID)
	if err := l.Validate(); err != nil {
		return err
	}
	if err := mustBeNew(tx, "lease", l.LeaseID, key); err != nil {
		return err
	}
	a, err := GetAttempt(tx, l.AttemptID)
	if err != nil {
		return fmt.Errorf("lease %s: %w", l.LeaseID, err)
	}
	if a.NodeID != l.NodeID || a.GroupID != l.GroupID {
		return fmt.Errorf("lease %s on node %s: attempt %s is on node %s: %w", l.LeaseID, l.NodeID, a.AttemptID, a.NodeID, ErrInvalidArgument)
	}
	if err := tx.Put(indexKey(prefixNodeLeases, l.NodeID, l.LeaseID), nil); err != nil {
		return err
	}
	if err := tx.Put(expiryKey(prefixLeaseExpiry, l.ExpiresAt, l.LeaseID), nil); err != nil {
		return err
	}
	l.CreatedAt = orNow(l.CreatedAt, tx)
	return putRecord(tx, "lease", key, &l)
}

// UpdateLease rewrites an existing lease (ErrNotFound), typically to renew
// it: only ExpiresAt and TTLMillis may change (ErrInvalidArgument
// otherwise); the expiry index follows. Checking the caller's fencing token
// against Token is the caller's, done in the same transaction.
func UpdateLease(tx Tx, l Lease) error {
	old, err := GetLease(tx, l.LeaseID)
	if err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return err
	}
	if err := firstErr(
		immutable("lease", l.LeaseID, "attempt_id", l.AttemptID == old.AttemptID),
		immutable("lease", l.LeaseID, "node_id", l.NodeID == old.NodeID),
		immutable("lease", l.LeaseID, "group_id", l.GroupID == old.GroupID),
		immutable("lease", l.LeaseID, "token", l.Token == old.Token),
		immutable("lease", l.LeaseID, "created_at", l.CreatedAt.Equal(old.CreatedAt)),
	); err != nil {
		return err
	}
	if !l.ExpiresAt.Equal(old.ExpiresAt) {
		if err := tx.Delete(expiryKey(prefixLeaseExpiry, old.ExpiresAt, l.LeaseID)); err != nil {
			return err
		}
		if err := tx.Put(expiryKey(prefixLeaseExpiry, l.ExpiresAt, l.LeaseID), nil); err != nil {
			return err
		}
	}
	return putRecord(tx, "lease", recordKey(prefixLease, l.LeaseID), &l)
}

// DeleteLease removes a lease and its index keys (release or expiry);
// ErrNotFound if it is already gone, so a caller can tell a stale release.
func DeleteLease(tx Tx, id string) error {
	l, err := GetLease(tx, id)
	if err != nil {
		return err
	}
	for _, k := range [][]byte{
		recordKey(prefixLease, id),
		indexKey(prefixNodeLeases, l.NodeID, id),
		expiryKey(prefixLeaseExpiry, l.ExpiresAt, id),
	} {
		if err := tx.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// LeasesOfNode lists the ids of the live lease records of a node.
func LeasesOfNode(r Reader, nodeID string) ([]string, error) {
	return listMembers(r, prefixNodeLeases, nodeID)
}

// ExpiredLeases calls fn with the id of every lease whose ExpiresAt is at or
// before now, soonest first. It reads only the expired part of the expiry
// index, so a reaper's cost follows the number of expired leases.
func ExpiredLeases(r Reader, now time.Time, fn func(leaseID string) error) error {
	return scanExpired(r, prefixLeaseExpiry, now, func(id string, _ []byte) error { return fn(id) })
}

// NextFencingToken draws the next fencing token: a store-wide counter, so a
// newer lease always carries a larger token than any older one.
func NextFencingToken(tx Tx) (uint64, error) { return Increment(tx, "lease-token") }

// Increment adds one to the named counter and returns the new value; a
// missing counter counts from 0. Counters are ordinary keys, so the new
// value commits or vanishes with the rest of the transaction.
func Increment(tx Tx, name string) (uint64, error) {
	v, err := Counter(tx, name)
	if err != nil {
		return 0, err
	}
	v++
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return v, tx.Put([]byte(prefixCounter+name), b[:])
}

// Counter reads the named counter; a missing one is 0.
func Counter(r Reader, name string) (uint64, error) {
	if err := checkName(name, "counter name"); err != nil {
		return 0, err
	}
	b, err := r.Get([]byte(prefixCounter + name))
	if errors.Is(err, ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("counter %s: %d bytes: %w", name, len(b), ErrCorrupt)
	}
	return binary.BigEndian.Uint64(b), nil
}
