package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/internal/randid"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
)

// Graph operations (spec: create_group, fork, inspect, prune, promote,
// evaluate). Every mutation runs through mutate: one journal Update that
// checks the idempotency key, applies the operation and records its result
// in the same batch, so a crash leaves the operation either absent or whole
// and a replay returns the first result unchanged.

// MaxFork bounds the children one fork creates, and so the journal batch
// of one fork. The first result of every mutation is kept whole under its
// idempotency key, up to journal.MaxResultSize: MaxFork drafts fit with a
// logical state of 1 KiB each; a larger state times n is refused
// (invalid argument) with nothing forked. Fork more in several calls.
const MaxFork = 10_000

// Operation names: the idempotency op and the failpoint namespace.
const (
	OpCreateGroup = "create_group"
	OpFork        = "fork"
	OpPromote     = "promote"
	OpEvaluate    = "evaluate"
	OpPrune       = "prune"
)

// Each mutating operation has a failpoint before its journal update and one
// after the commit (the journal adds its own inside the update).
var opFailpoints = map[string][2]string{}

func init() {
	for _, op := range []string{OpCreateGroup, OpFork, OpPromote, OpEvaluate, OpPrune,
		OpActivate, OpSuspend, OpRelease, OpRenew, OpRetry} {
		opFailpoints[op] = [2]string{
			failpoint.Declare("fabric." + op + ".before-update"),
			failpoint.Declare("fabric." + op + ".after-commit"),
		}
	}
}

// freshResults are the operations whose fn returns its result exactly as
// decoding the recorded bytes would give it back (no json.RawMessage left
// as the caller wrote it, no empty slice that the record omits): mutate
// hands that value over as it is instead of decoding what it just encoded,
// a good part of the CPU of a fork (issue 21). TestFreshResultIsTheReplay
// holds them to it.
var freshResults = map[string]bool{OpFork: true, OpEvaluate: true}

// mutate runs fn as the idempotent journal update of op and decodes the
// recorded result (the first one, on a replay) into out.
func (f *Fabric) mutate(ctx context.Context, op string, req any, out any, fn func(tx journal.Tx, ci CallInfo) (any, error)) error {
	ci := f.callInfo(ctx)
	fp := opFailpoints[op]
	if err := failpoint.Inject(fp[0]); err != nil {
		return err
	}
	ttl := time.Duration(0)
	if ci.KeyGenerated {
		ttl = f.opts.GeneratedKeyTTL
	}
	// A write session's commit follows the remote collection's protocol
	// (remotegc.go): it waits for a running collection and makes its
	// objects durable again after one.
	rs, _ := ctx.Value(remoteSessionKey{}).(*remoteSession)
	var raw []byte
	var replayed bool
	var err error
	var fresh any // fn's result in the run that committed
	for {
		var overlap *errRemoteGCOverlap
		raw, replayed, err = journal.DoIdempotentFor(ctx, f.journal, ci.IdempotencyKey, op, req, ttl, func(tx journal.Tx) (any, error) {
			fresh = nil
			if rs != nil {
				if err := f.checkRemoteGC(tx, rs); err != nil {
					return nil, err
				}
			}
			v, err := fn(tx, ci)
			fresh = v
			return v, err
		})
		if !errors.As(err, &overlap) {
			break
		}
		if err := f.afterRemoteGC(ctx, rs, overlap.state); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := failpoint.Inject(fp[1]); err != nil {
		return err
	}
	if replayed {
		f.log.Debug("idempotent replay", "op", op, "idempotency_key", ci.IdempotencyKey)
	}
	if out == nil {
		return nil
	}
	if !replayed && freshResults[op] {
		if o := reflect.ValueOf(out).Elem(); fresh != nil && reflect.TypeOf(fresh) == o.Type() {
			o.Set(reflect.ValueOf(fresh))
			return nil
		}
	}
	return json.Unmarshal(raw, out)
}

// callInfo returns the request's call info, generating the idempotency key
// and trace id a caller did not send: every mutation has a key.
func (f *Fabric) callInfo(ctx context.Context) CallInfo {
	ci, _ := CallInfoFrom(ctx)
	if ci.IdempotencyKey == "" {
		ci.IdempotencyKey, ci.KeyGenerated = "gen-"+randid.Hex(16), true
	}
	if ci.TraceID == "" {
		ci.TraceID = randid.Hex(16)
	}
	if ci.SpanID == "" {
		ci.SpanID = randid.Hex(8)
	}
	return ci
}

// ExpireIdempotencyKeys deletes the recorded results of made-up keys
// (CallInfo.KeyGenerated) older than Options.GeneratedKeyTTL, a thousand
// per journal commit, and returns how many it deleted. esfd calls it every
// minute.
func (f *Fabric) ExpireIdempotencyKeys(ctx context.Context) (int, error) {
	const batch = 1000
	total := 0
	for {
		var n int
		err := f.journal.Update(ctx, func(tx journal.Tx) (err error) {
			n, err = journal.ExpireIdempotency(tx, tx.Now(), batch)
			return err
		})
		total += n
		if err != nil {
			return total, fmt.Errorf("expire idempotency keys: %w", err)
		}
		if n < batch {
			return total, nil
		}
	}
}

// event stamps ev with the call's correlation ids and appends it.
func event(tx journal.Tx, ci CallInfo, ev journal.Event, data any) error {
	ev.TraceID, ev.SpanID, ev.IdempotencyKey = ci.TraceID, ci.SpanID, ci.IdempotencyKey
	if data != nil {
		b, err := json.Marshal(data)
		if err != nil {
			return err
		}
		ev.Data = b
	}
	return tx.AppendEvent(ev)
}

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
	Group journal.Group `json:"group"`
	Node  journal.Node  `json:"node"`
}

// CreateGroup makes a group whose root node is sealed at req.RootID; the
// canonical node is the root node and the generation is 1.
//
// The root must stay whole until the group's node pins it, whatever a
// garbage collection does meanwhile. A root named by a node that is not
// pruned is live, and the node is checked again in the transaction that
// commits the group (as Fork does). Any other root (an id from an import,
// or from a pruned node) may be garbage: CreateGroup enters a GC session
// and Has every object of the tree, which either protects it from a
// running collection or finds it gone; an incomplete root is refused
// (not found), never committed.
func (f *Fabric) CreateGroup(ctx context.Context, req CreateGroupRequest) (CreateGroupResult, error) {
	return f.createGroup(ctx, req, false)
}

// CreateGroupFrom imports src and creates a group on the root in one GC
// session, so that no collection can take the import's objects before the
// group pins them (and nothing needs checking afterwards).
func (f *Fabric) CreateGroupFrom(ctx context.Context, src ImportSource, req CreateGroupRequest) (CreateGroupResult, error) {
	leave := f.store.Enter()
	defer leave()
	ctx = f.remoteSession(ctx)
	imp, err := f.importInSession(ctx, src)
	if err != nil {
		return CreateGroupResult{}, fmt.Errorf("create group: %w", err)
	}
	req.RootID = imp.Root.String()
	return f.createGroup(ctx, req, true)
}

// createGroup is CreateGroup; inSession says the caller's GC session
// stored or found every object of the root.
func (f *Fabric) createGroup(ctx context.Context, req CreateGroupRequest, inSession bool) (CreateGroupResult, error) {
	var res CreateGroupResult
	if err := checkJSON("policy", req.Policy); err != nil {
		return res, err
	}
	if err := checkJSON("logical_state", req.LogicalState); err != nil {
		return res, err
	}
	if req.Name != "" {
		if err := journal.CheckGroupName(req.Name); err != nil {
			return res, fmt.Errorf("create group: %w", err)
		}
	}
	root, err := f.resolveRoot(ctx, req.RootID)
	if err != nil {
		return res, fmt.Errorf("create group: %w", err)
	}
	// A live node keeps the root alive if it is still unpruned when the
	// group commits; otherwise the objects themselves must be protected.
	liveNode := ""
	if strings.HasPrefix(strings.TrimSpace(req.RootID), string(journal.KindNode)+"_") {
		var n journal.Node
		err := f.journal.View(ctx, func(r journal.Reader) (err error) {
			n, err = journal.GetNode(r, strings.TrimSpace(req.RootID))
			return err
		})
		if err == nil && n.Status != journal.NodePruned {
			liveNode = n.NodeID
		}
	}
	ctx = f.remoteSession(ctx) // the Has of verifyTrees are recorded
	if liveNode == "" && !inSession {
		leave := f.store.Enter(root)
		defer leave()
		if err := verifyTrees(ctx, f.store, root); err != nil {
			return res, fmt.Errorf("create group: root %s is incomplete (collected as garbage? import it again): %v: %w", root, err, journal.ErrNotFound)
		}
	}
	req.RootID = root.String()
	err = f.mutate(ctx, OpCreateGroup, req, &res, func(tx journal.Tx, ci CallInfo) (any, error) {
		if liveNode != "" {
			n, err := journal.GetNode(tx, liveNode)
			if err != nil {
				return nil, err
			}
			if n.Status == journal.NodePruned {
				return nil, fmt.Errorf("node %s was pruned meanwhile: %w", liveNode, journal.ErrFailedPrecondition)
			}
		}
		gid, err := f.ids.New(journal.KindGroup)
		if err != nil {
			return nil, err
		}
		nid, err := f.ids.New(journal.KindNode)
		if err != nil {
			return nil, err
		}
		g := journal.Group{GroupID: gid, RootNodeID: nid, CanonicalNodeID: nid, Generation: 1, Policy: req.Policy, Name: req.Name}
		if err := journal.CreateGroup(tx, g); err != nil {
			return nil, err
		}
		n := journal.Node{NodeID: nid, GroupID: gid, Parents: []string{}, RootID: req.RootID,
			LogicalState: req.LogicalState, Status: journal.NodeSealed,
			Provenance: journal.Provenance{Op: OpCreateGroup, Source: req.Source,
				IdempotencyKey: ci.IdempotencyKey, TraceID: ci.TraceID}}
		if err := journal.CreateNode(tx, n); err != nil {
			return nil, err
		}
		if g, err = journal.GetGroup(tx, gid); err != nil {
			return nil, err
		}
		if n, err = journal.GetNode(tx, nid); err != nil {
			return nil, err
		}
		if err := event(tx, ci, g.Event(journal.EventGroupCreated), nil); err != nil {
			return nil, err
		}
		if err := event(tx, ci, n.Event(journal.EventNodeCreated), nil); err != nil {
			return nil, err
		}
		return CreateGroupResult{Group: g, Node: n}, nil
	})
	return res, err
}

// GroupByName returns the group named name (not_found if none).
func (f *Fabric) GroupByName(ctx context.Context, name string) (journal.Group, error) {
	var g journal.Group
	err := f.journal.View(ctx, func(r journal.Reader) (err error) {
		g, err = journal.GroupByName(r, name)
		return err
	})
	return g, err
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
	Nodes []journal.Node `json:"nodes"`
}

// Fork creates N draft children of a sealed node: metadata only, each
// child's base is the parent's root, so no content is read or written.
func (f *Fabric) Fork(ctx context.Context, req ForkRequest) (ForkResult, error) {
	var res ForkResult
	if req.N == 0 {
		req.N = 1
	}
	if req.N < 0 || req.N > MaxFork {
		return res, fmt.Errorf("fork: n = %d, want 1..%d: %w", req.N, MaxFork, journal.ErrInvalidArgument)
	}
	if err := journal.CheckID(journal.KindNode, req.NodeID); err != nil {
		return res, fmt.Errorf("fork: %w", err)
	}
	if err := checkJSON("logical_state", req.LogicalState); err != nil {
		return res, err
	}
	err := f.mutate(ctx, OpFork, req, &res, func(tx journal.Tx, ci CallInfo) (any, error) {
		parent, err := journal.GetNode(tx, req.NodeID)
		if err != nil {
			return nil, err
		}
		if parent.Status != journal.NodeSealed {
			return nil, fmt.Errorf("node %s is %s; only sealed nodes fork: %w", parent.NodeID, parent.Status, journal.ErrFailedPrecondition)
		}
		state := req.LogicalState
		if state == nil {
			state = parent.LogicalState
		} else if state, err = json.Marshal(state); err != nil {
			// As the record holds it (compact, HTML-escaped), so the
			// result is the one a replay decodes (freshResults).
			return nil, err
		}
		out := ForkResult{Nodes: make([]journal.Node, 0, req.N)}
		for range req.N {
			id, err := f.ids.New(journal.KindNode)
			if err != nil {
				return nil, err
			}
			n := journal.Node{NodeID: id, GroupID: parent.GroupID, Parents: []string{parent.NodeID},
				RootID: parent.RootID, LogicalState: state, Status: journal.NodeDraft, CreatedAt: tx.Now(),
				Provenance: journal.Provenance{Op: OpFork, IdempotencyKey: ci.IdempotencyKey, TraceID: ci.TraceID}}
			// One child's result is one node record, which CreateNode
			// holds to journal.MaxValueSize, far below MaxResultSize.
			if len(out.Nodes) == 0 && req.N > 1 {
				if err := checkForkResult(n, req.N); err != nil {
					return nil, err
				}
			}
			if err := journal.CreateChild(tx, n, parent); err != nil {
				return nil, err
			}
			if err := event(tx, ci, n.Event(journal.EventNodeForked), map[string]string{"parent": parent.NodeID}); err != nil {
				return nil, err
			}
			out.Nodes = append(out.Nodes, n)
		}
		return out, nil
	})
	return res, err
}

// checkForkResult refuses, before anything is written, a fork whose
// result could not be recorded: n children like first (they differ only in
// their ids, all of one length) would pass journal.MaxResultSize.
func checkForkResult(first journal.Node, n int) error {
	b, err := json.Marshal(first)
	if err != nil {
		return err
	}
	if size := (len(b) + 1) * n; size > journal.MaxResultSize {
		return fmt.Errorf("fork: %d children of %d bytes each make a result of %d bytes, over the %d a result may have; fork fewer at once: %w",
			n, len(b), size, journal.MaxResultSize, journal.ErrInvalidArgument)
	}
	return nil
}

// PromoteRequest moves a group's canonical node by compare-and-swap.
type PromoteRequest struct {
	GroupID            string `json:"group_id"`
	NodeID             string `json:"node_id"`
	ExpectedGeneration uint64 `json:"expected_generation"`
}

// Promote makes req.NodeID canonical if the group is still at
// req.ExpectedGeneration (ErrStaleGeneration otherwise) and advances the
// generation by one. Only sealed or terminal nodes of the group qualify.
func (f *Fabric) Promote(ctx context.Context, req PromoteRequest) (journal.Group, error) {
	var g journal.Group
	if err := firstErr(journal.CheckID(journal.KindGroup, req.GroupID), journal.CheckID(journal.KindNode, req.NodeID)); err != nil {
		return g, fmt.Errorf("promote: %w", err)
	}
	if req.ExpectedGeneration == 0 {
		return g, fmt.Errorf("promote: expected_generation is required: %w", journal.ErrInvalidArgument)
	}
	err := f.mutate(ctx, OpPromote, req, &g, func(tx journal.Tx, ci CallInfo) (any, error) {
		return promote(tx, ci, req.GroupID, req.NodeID, req.ExpectedGeneration)
	})
	return g, err
}

// promote is the compare-and-swap itself, shared with merge --promote.
func promote(tx journal.Tx, ci CallInfo, groupID, nodeID string, expected uint64) (journal.Group, error) {
	g, err := journal.GetGroup(tx, groupID)
	if err != nil {
		return g, err
	}
	if g.Generation != expected {
		return g, fmt.Errorf("group %s is at generation %d, not %d: %w", groupID, g.Generation, expected, journal.ErrStaleGeneration)
	}
	n, err := journal.GetNode(tx, nodeID)
	if err != nil {
		return g, err
	}
	if n.GroupID != groupID {
		return g, fmt.Errorf("node %s belongs to group %s, not %s: %w", nodeID, n.GroupID, groupID, journal.ErrInvalidArgument)
	}
	if n.Status != journal.NodeSealed && n.Status != journal.NodeTerminal {
		return g, fmt.Errorf("node %s is %s; only sealed or terminal nodes become canonical: %w", nodeID, n.Status, journal.ErrFailedPrecondition)
	}
	from := g.CanonicalNodeID
	g.CanonicalNodeID = nodeID
	g.Generation++
	if err := journal.UpdateGroup(tx, g); err != nil {
		return g, err
	}
	ev := g.Event(journal.EventGroupPromoted)
	ev.RootID = n.RootID
	return g, event(tx, ci, ev, map[string]any{"from": from, "generation": g.Generation})
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

// Evaluate records an evaluation of a sealed node. With Terminal the node
// becomes terminal; with Backprop one visit and the reward are added to the
// node and every ancestor, in the same batch, exactly once per idempotency
// key (FR-05).
func (f *Fabric) Evaluate(ctx context.Context, req EvaluateRequest) (journal.Evaluation, error) {
	var ev journal.Evaluation
	name, version, ok := strings.Cut(req.Evaluator, "@")
	if !ok || name == "" || version == "" {
		return ev, fmt.Errorf("evaluate: evaluator %q: want NAME@VERSION: %w", req.Evaluator, journal.ErrInvalidArgument)
	}
	if math.IsNaN(req.Reward) || math.IsInf(req.Reward, 0) {
		return ev, fmt.Errorf("evaluate: reward must be finite: %w", journal.ErrInvalidArgument)
	}
	ctx = f.remoteSession(ctx) // the evidence found is recorded
	for _, e := range req.Evidence {
		id, err := cas.ParseID(e)
		if err != nil {
			return ev, fmt.Errorf("evaluate: evidence: %w", err)
		}
		if ok, err := f.store.Has(ctx, id); err != nil || !ok {
			return ev, fmt.Errorf("evaluate: evidence %s: %w", e, orNotFound(err))
		}
	}
	err := f.mutate(ctx, OpEvaluate, req, &ev, func(tx journal.Tx, ci CallInfo) (any, error) {
		nodeID, attemptID, err := evaluationTarget(tx, req.Target)
		if err != nil {
			return nil, err
		}
		n, err := journal.GetNode(tx, nodeID)
		if err != nil {
			return nil, err
		}
		if n.Status != journal.NodeSealed && n.Status != journal.NodeTerminal {
			return nil, fmt.Errorf("node %s is %s; only sealed results are evaluated: %w", nodeID, n.Status, journal.ErrFailedPrecondition)
		}
		id, err := f.ids.New(journal.KindEvaluation)
		if err != nil {
			return nil, err
		}
		// The evaluation as its record reads back (freshResults): its
		// time set here, no empty evidence list.
		e := journal.Evaluation{EvaluationID: id, NodeID: nodeID, AttemptID: attemptID, GroupID: n.GroupID,
			Evaluator: name, EvaluatorVersion: version, Reward: req.Reward, Verdict: req.Verdict,
			Evidence: req.Evidence, Terminal: req.Terminal, Backprop: req.Backprop, CreatedAt: tx.Now()}
		if len(e.Evidence) == 0 {
			e.Evidence = nil
		}
		if err := journal.CreateEvaluation(tx, e); err != nil {
			return nil, err
		}
		if err := event(tx, ci, e.Event(journal.EventEvaluationCreated), map[string]any{"reward": req.Reward, "verdict": req.Verdict}); err != nil {
			return nil, err
		}
		if req.Terminal && n.Status == journal.NodeSealed {
			if err := setNodeStatus(tx, ci, &n, journal.NodeTerminal); err != nil {
				return nil, err
			}
		}
		if req.Backprop {
			if err := backprop(tx, ci, n, req.Reward); err != nil {
				return nil, err
			}
		}
		return e, nil
	})
	return ev, err
}

func evaluationTarget(r journal.Reader, target string) (nodeID, attemptID string, err error) {
	kind, err := journal.KindOf(target)
	if err != nil {
		return "", "", err
	}
	switch kind {
	case journal.KindNode:
		return target, "", nil
	case journal.KindAttempt:
		a, err := journal.GetAttempt(r, target)
		if err != nil {
			return "", "", err
		}
		if a.ResultNodeID == "" {
			return "", "", fmt.Errorf("attempt %s has sealed no result: %w", target, journal.ErrFailedPrecondition)
		}
		return a.ResultNodeID, target, nil
	}
	return "", "", fmt.Errorf("evaluate target %s: want a node or attempt id: %w", target, journal.ErrInvalidArgument)
}

// backprop adds one visit and reward to n and each of its ancestors once.
func backprop(tx journal.Tx, ci CallInfo, n journal.Node, reward float64) error {
	// Each node is updated from the record read in this transaction (n by
	// Evaluate, the ancestors by AncestorsOf), not read again.
	add := func(m journal.Node) error {
		old := m
		m.Visits++
		m.Value += reward
		if err := journal.UpdateReadNode(tx, old, m); err != nil {
			return err
		}
		return event(tx, ci, m.Event(journal.EventNodeBackprop), map[string]any{"visits": m.Visits, "value": m.Value})
	}
	if err := add(n); err != nil {
		return err
	}
	return journal.AncestorsOf(tx, n, add)
}

func setNodeStatus(tx journal.Tx, ci CallInfo, n *journal.Node, to journal.NodeStatus) error {
	from := n.Status
	if err := n.Transition(to); err != nil {
		return err
	}
	if err := journal.UpdateNode(tx, *n); err != nil {
		return err
	}
	return event(tx, ci, n.Event(journal.EventNodeState), map[string]any{"from": from, "to": to})
}

// PruneRequest marks a subtree pruned.
type PruneRequest struct {
	NodeID string `json:"node_id"`
}

// PruneResult lists the nodes that became pruned.
type PruneResult struct {
	Pruned []string `json:"pruned"`
}

// Prune marks NodeID and every descendant pruned, making their content
// eligible for GC. It refuses (ErrFailedPrecondition, naming the lease) if
// any attempt in the subtree holds a lease, and refuses to prune the group's
// canonical node or root node.
func (f *Fabric) Prune(ctx context.Context, req PruneRequest) (PruneResult, error) {
	var res PruneResult
	if err := journal.CheckID(journal.KindNode, req.NodeID); err != nil {
		return res, fmt.Errorf("prune: %w", err)
	}
	err := f.mutate(ctx, OpPrune, req, &res, func(tx journal.Tx, ci CallInfo) (any, error) {
		top, err := journal.GetNode(tx, req.NodeID)
		if err != nil {
			return nil, err
		}
		g, err := journal.GetGroup(tx, top.GroupID)
		if err != nil {
			return nil, err
		}
		var subtree []journal.Node
		seen := map[string]bool{}
		queue := []string{top.NodeID}
		for len(queue) > 0 {
			id := queue[0]
			queue = queue[1:]
			if seen[id] {
				continue
			}
			seen[id] = true
			n, err := journal.GetNode(tx, id)
			if err != nil {
				return nil, err
			}
			if id == g.CanonicalNodeID || id == g.RootNodeID {
				return nil, fmt.Errorf("node %s is the group's %s node and cannot be pruned: %w",
					id, map[bool]string{true: "canonical", false: "root"}[id == g.CanonicalNodeID], journal.ErrFailedPrecondition)
			}
			leases, err := journal.LeasesOfNode(tx, id)
			if err != nil {
				return nil, err
			}
			if len(leases) > 0 {
				return nil, fmt.Errorf("node %s is leased (lease %s): %w", id, leases[0], journal.ErrFailedPrecondition)
			}
			subtree = append(subtree, n)
			kids, err := journal.ChildrenOf(tx, id)
			if err != nil {
				return nil, err
			}
			queue = append(queue, kids...)
		}
		out := PruneResult{Pruned: []string{}}
		for i := range subtree {
			if subtree[i].Status == journal.NodePruned {
				continue
			}
			if err := setNodeStatus(tx, ci, &subtree[i], journal.NodePruned); err != nil {
				return nil, err
			}
			out.Pruned = append(out.Pruned, subtree[i].NodeID)
		}
		return out, nil
	})
	return res, err
}

func checkJSON(field string, b json.RawMessage) error {
	if b != nil && !json.Valid(b) {
		return fmt.Errorf("%s is not valid JSON: %w", field, journal.ErrInvalidArgument)
	}
	return nil
}

func orNotFound(err error) error {
	if err != nil {
		return err
	}
	return cas.ErrNotFound
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
