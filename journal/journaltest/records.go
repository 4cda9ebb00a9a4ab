package journaltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/journal"
)

var (
	rootA = strings.Repeat("ab", 32)
	rootB = strings.Repeat("cd", 32)
)

func update(t *testing.T, s journal.Store, fn func(tx journal.Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func tryUpdate(s journal.Store, fn func(tx journal.Tx) error) error {
	return s.Update(context.Background(), fn)
}

func view(t *testing.T, s journal.Store, fn func(r journal.Reader) error) {
	t.Helper()
	if err := s.View(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

// seedGroup creates group g with a sealed root node r.
func seedGroup(t *testing.T, s journal.Store, g, r string) {
	t.Helper()
	update(t, s, func(tx journal.Tx) error {
		if err := journal.CreateGroup(tx, journal.Group{GroupID: g, RootNodeID: r, CanonicalNodeID: r, Generation: 1, Policy: json.RawMessage(`{"max_attempts":4}`)}); err != nil {
			return err
		}
		return journal.CreateNode(tx, journal.Node{NodeID: r, GroupID: g, RootID: rootA, Status: journal.NodeSealed,
			Provenance: journal.Provenance{Op: "create_group", Source: "testdata/tree"}})
	})
}

func fork(tx journal.Tx, g, id string, parents ...string) error {
	return journal.CreateNode(tx, journal.Node{NodeID: id, GroupID: g, Parents: parents, RootID: rootA,
		Status: journal.NodeDraft, LogicalState: json.RawMessage(`{"step":1}`), Provenance: journal.Provenance{Op: "fork"}})
}

func testRecords(t *testing.T, open func(*testing.T, Options) journal.Store) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := open(t, Options{Now: func() time.Time { return at }})
	seedGroup(t, s, "grp_a", "node_r")
	seedGroup(t, s, "grp_b", "node_rb")
	update(t, s, func(tx journal.Tx) error {
		for _, id := range []string{"node_c1", "node_c2", "node_c3"} {
			if err := fork(tx, "grp_a", id, "node_r"); err != nil {
				return err
			}
		}
		// CreateChild is the same with the parent already read.
		p, err := journal.GetNode(tx, "node_c1")
		if err != nil {
			return err
		}
		return journal.CreateChild(tx, journal.Node{NodeID: "node_g1", GroupID: "grp_a", Parents: []string{"node_c1"}, RootID: rootA,
			Status: journal.NodeDraft, LogicalState: json.RawMessage(`{"step":1}`), Provenance: journal.Provenance{Op: "fork"}}, p)
	})

	view(t, s, func(r journal.Reader) error {
		g, err := journal.GetGroup(r, "grp_a")
		if err != nil {
			return err
		}
		if g.CanonicalNodeID != "node_r" || g.Generation != 1 || !g.CreatedAt.Equal(at) || string(g.Policy) != `{"max_attempts":4}` {
			t.Errorf("group = %+v", g)
		}
		n, err := journal.GetNode(r, "node_c1")
		if err != nil {
			return err
		}
		if n.Status != journal.NodeDraft || len(n.Parents) != 1 || n.Parents[0] != "node_r" || n.RootID != rootA ||
			string(n.LogicalState) != `{"step":1}` || !n.CreatedAt.Equal(at) || n.Provenance.Op != "fork" {
			t.Errorf("node = %+v", n)
		}
		kids, err := journal.ChildrenOf(r, "node_r")
		if err != nil {
			return err
		}
		if fmt.Sprint(kids) != "[node_c1 node_c2 node_c3]" {
			t.Errorf("ChildrenOf(node_r) = %v", kids)
		}
		if kids, _ := journal.ChildrenOf(r, "node_c2"); len(kids) != 0 {
			t.Errorf("ChildrenOf(leaf) = %v", kids)
		}
		var members []string
		if err := journal.NodesOfGroup(r, "grp_a", func(id string) error { members = append(members, id); return nil }); err != nil {
			return err
		}
		if fmt.Sprint(members) != "[node_c1 node_c2 node_c3 node_g1 node_r]" {
			t.Errorf("NodesOfGroup(grp_a) = %v", members)
		}
		var groups []string
		if err := journal.Groups(r, func(g journal.Group) error { groups = append(groups, g.GroupID); return nil }); err != nil {
			return err
		}
		if fmt.Sprint(groups) != "[grp_a grp_b]" {
			t.Errorf("Groups = %v", groups)
		}
		// A root node lists its parents as [] for clients.
		root, _ := journal.GetNode(r, "node_r")
		if b, _ := json.Marshal(root); !strings.Contains(string(b), `"parents":[]`) {
			t.Errorf("root node JSON %s lacks \"parents\":[]", b)
		}
		return nil
	})

	// Lookups: a missing id, a malformed id, an id of the wrong kind.
	view(t, s, func(r journal.Reader) error {
		if _, err := journal.GetNode(r, "node_missing"); !errors.Is(err, journal.ErrNotFound) {
			t.Errorf("GetNode(missing): %v", err)
		}
		if _, err := journal.GetNode(r, "att_x"); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("GetNode(attempt id): %v", err)
		}
		if _, err := journal.GetGroup(r, "grp_a/../x"); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("GetGroup(malformed): %v", err)
		}
		return nil
	})

	// Create errors, each in its own transaction, which must leave nothing.
	createErrs := []struct {
		name string
		fn   func(tx journal.Tx) error
		want error
	}{
		{"duplicate node", func(tx journal.Tx) error { return fork(tx, "grp_a", "node_c1", "node_r") }, journal.ErrExists},
		{"duplicate group", func(tx journal.Tx) error {
			return journal.CreateGroup(tx, journal.Group{GroupID: "grp_a", RootNodeID: "node_r", CanonicalNodeID: "node_r", Generation: 1})
		}, journal.ErrExists},
		{"missing parent", func(tx journal.Tx) error { return fork(tx, "grp_a", "node_new", "node_nope") }, journal.ErrNotFound},
		{"missing group", func(tx journal.Tx) error { return fork(tx, "grp_nope", "node_new", "node_r") }, journal.ErrNotFound},
		{"parent in another group", func(tx journal.Tx) error { return fork(tx, "grp_b", "node_new", "node_r") }, journal.ErrInvalidArgument},
		{"child of a parent not named", func(tx journal.Tx) error {
			p, err := journal.GetNode(tx, "node_c1")
			if err != nil {
				return err
			}
			return journal.CreateChild(tx, journal.Node{NodeID: "node_new", GroupID: "grp_a", Parents: []string{"node_r"}, RootID: rootA,
				Status: journal.NodeDraft, Provenance: journal.Provenance{Op: "fork"}}, p)
		}, journal.ErrInvalidArgument},
		{"child of a parent in another group", func(tx journal.Tx) error {
			p, err := journal.GetNode(tx, "node_r")
			if err != nil {
				return err
			}
			return journal.CreateChild(tx, journal.Node{NodeID: "node_new", GroupID: "grp_b", Parents: []string{"node_r"}, RootID: rootA,
				Status: journal.NodeDraft, Provenance: journal.Provenance{Op: "fork"}}, p)
		}, journal.ErrInvalidArgument},
		{"self parent", func(tx journal.Tx) error { return fork(tx, "grp_a", "node_new", "node_new") }, journal.ErrInvalidArgument},
		{"repeated parent", func(tx journal.Tx) error { return fork(tx, "grp_a", "node_new", "node_r", "node_r") }, journal.ErrInvalidArgument},
		{"bad root id", func(tx journal.Tx) error {
			return journal.CreateNode(tx, journal.Node{NodeID: "node_new", GroupID: "grp_a", Parents: []string{"node_r"}, RootID: "xyz", Status: journal.NodeDraft, Provenance: journal.Provenance{Op: "fork"}})
		}, journal.ErrInvalidArgument},
		{"bad status", func(tx journal.Tx) error {
			return journal.CreateNode(tx, journal.Node{NodeID: "node_new", GroupID: "grp_a", Parents: []string{"node_r"}, RootID: rootA, Status: "zombie", Provenance: journal.Provenance{Op: "fork"}})
		}, journal.ErrInvalidArgument},
		{"bad logical state", func(tx journal.Tx) error {
			return journal.CreateNode(tx, journal.Node{NodeID: "node_new", GroupID: "grp_a", Parents: []string{"node_r"}, RootID: rootA, Status: journal.NodeDraft, LogicalState: json.RawMessage(`{`), Provenance: journal.Provenance{Op: "fork"}})
		}, journal.ErrInvalidArgument},
		{"missing provenance op", func(tx journal.Tx) error {
			return journal.CreateNode(tx, journal.Node{NodeID: "node_new", GroupID: "grp_a", Parents: []string{"node_r"}, RootID: rootA, Status: journal.NodeDraft})
		}, journal.ErrInvalidArgument},
		{"generation 0", func(tx journal.Tx) error {
			return journal.CreateGroup(tx, journal.Group{GroupID: "grp_new", RootNodeID: "node_r", CanonicalNodeID: "node_r"})
		}, journal.ErrInvalidArgument},
		{"attempt of missing node", func(tx journal.Tx) error {
			return journal.CreateAttempt(tx, journal.Attempt{AttemptID: "att_new", NodeID: "node_nope", GroupID: "grp_a", Executor: "runc", State: journal.AttemptQueued})
		}, journal.ErrNotFound},
		{"attempt in wrong group", func(tx journal.Tx) error {
			return journal.CreateAttempt(tx, journal.Attempt{AttemptID: "att_new", NodeID: "node_r", GroupID: "grp_b", Executor: "runc", State: journal.AttemptQueued})
		}, journal.ErrInvalidArgument},
		{"runtime of missing attempt", func(tx journal.Tx) error {
			return journal.PutAttemptRuntime(tx, journal.AttemptRuntime{AttemptID: "att_nope", Worker: "w1"})
		}, journal.ErrNotFound},
		{"evaluation with NaN reward", func(tx journal.Tx) error {
			return journal.CreateEvaluation(tx, journal.Evaluation{EvaluationID: "eval_new", NodeID: "node_r", GroupID: "grp_a", Evaluator: "e", EvaluatorVersion: "1", Reward: nan()})
		}, journal.ErrInvalidArgument},
	}
	for _, tc := range createErrs {
		before := viewScan(t, s, "", "")
		err := tryUpdate(s, tc.fn)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if after := viewScan(t, s, "", ""); !equal(before, after) {
			t.Errorf("%s: a failed create changed the store", tc.name)
		}
	}

	// Attempts, runtime records and evaluations with their indexes.
	update(t, s, func(tx journal.Tx) error {
		if err := journal.CreateAttempt(tx, journal.Attempt{AttemptID: "att_1", NodeID: "node_c1", GroupID: "grp_a", Executor: "runc", State: journal.AttemptQueued}); err != nil {
			return err
		}
		if err := journal.CreateAttempt(tx, journal.Attempt{AttemptID: "att_2", NodeID: "node_c1", GroupID: "grp_a", Executor: "wasi", State: journal.AttemptQueued, RetryOf: "att_1"}); err != nil {
			return err
		}
		if err := journal.PutAttemptRuntime(tx, journal.AttemptRuntime{AttemptID: "att_1", Worker: "w1", PrivateDelta: "/var/lib/esf/deltas/att_1", Data: json.RawMessage(`{"pid":42}`)}); err != nil {
			return err
		}
		if err := journal.CreateEvaluation(tx, journal.Evaluation{EvaluationID: "eval_1", NodeID: "node_c1", AttemptID: "att_1", GroupID: "grp_a",
			Evaluator: "pytest", EvaluatorVersion: "8.1", Reward: 0.5, Verdict: "pass", Evidence: []string{rootB}}); err != nil {
			return err
		}
		return journal.CreateEvaluation(tx, journal.Evaluation{EvaluationID: "eval_2", NodeID: "node_c1", GroupID: "grp_a", Evaluator: "judge", EvaluatorVersion: "2", Reward: -1, Verdict: "fail", Terminal: true})
	})
	view(t, s, func(r journal.Reader) error {
		atts, err := journal.AttemptsOfNode(r, "node_c1")
		if err != nil || fmt.Sprint(atts) != "[att_1 att_2]" {
			t.Errorf("AttemptsOfNode = %v, %v", atts, err)
		}
		a, err := journal.GetAttempt(r, "att_2")
		if err != nil || a.RetryOf != "att_1" || a.Executor != "wasi" || !a.UpdatedAt.Equal(at) {
			t.Errorf("GetAttempt = %+v, %v", a, err)
		}
		rt, err := journal.GetAttemptRuntime(r, "att_1")
		if err != nil || rt.Worker != "w1" || string(rt.Data) != `{"pid":42}` {
			t.Errorf("GetAttemptRuntime = %+v, %v", rt, err)
		}
		// The durable attempt record holds no worker-local path.
		raw, _ := r.Get([]byte("attempt/att_1"))
		if strings.Contains(string(raw), "/var/lib") {
			t.Errorf("attempt record carries a worker-local path: %s", raw)
		}
		evs, err := journal.EvaluationsOfNode(r, "node_c1")
		if err != nil || fmt.Sprint(evs) != "[eval_1 eval_2]" {
			t.Errorf("EvaluationsOfNode = %v, %v", evs, err)
		}
		evs, err = journal.EvaluationsOfAttempt(r, "att_1")
		if err != nil || fmt.Sprint(evs) != "[eval_1]" {
			t.Errorf("EvaluationsOfAttempt = %v, %v", evs, err)
		}
		e, err := journal.GetEvaluation(r, "eval_1")
		if err != nil || e.Reward != 0.5 || e.Evidence[0] != rootB || e.Evaluator != "pytest" {
			t.Errorf("GetEvaluation = %+v, %v", e, err)
		}
		return nil
	})
	if err := tryUpdate(s, func(tx journal.Tx) error {
		return journal.CreateEvaluation(tx, journal.Evaluation{EvaluationID: "eval_3", NodeID: "node_c2", AttemptID: "att_1", GroupID: "grp_a", Evaluator: "e", EvaluatorVersion: "1"})
	}); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Errorf("evaluation of node_c2 by an attempt of node_c1: %v", err)
	}
	update(t, s, func(tx journal.Tx) error { return journal.DeleteAttemptRuntime(tx, "att_1") })
	view(t, s, func(r journal.Reader) error {
		if _, err := journal.GetAttemptRuntime(r, "att_1"); !errors.Is(err, journal.ErrNotFound) {
			t.Errorf("runtime after delete: %v", err)
		}
		return nil
	})

	// Groups: promote-like updates.
	groupErrs := []struct {
		name   string
		change func(g *journal.Group)
		want   error
	}{
		{"generation back", func(g *journal.Group) { g.Generation = 0 }, journal.ErrInvalidArgument},
		{"canonical missing", func(g *journal.Group) { g.CanonicalNodeID = "node_nope"; g.Generation++ }, journal.ErrNotFound},
		{"canonical in other group", func(g *journal.Group) { g.CanonicalNodeID = "node_rb"; g.Generation++ }, journal.ErrInvalidArgument},
		{"root changes", func(g *journal.Group) { g.RootNodeID = "node_c1" }, journal.ErrInvalidArgument},
	}
	for _, tc := range groupErrs {
		err := tryUpdate(s, func(tx journal.Tx) error {
			g, err := journal.GetGroup(tx, "grp_a")
			if err != nil {
				return err
			}
			tc.change(&g)
			return journal.UpdateGroup(tx, g)
		})
		if !errors.Is(err, tc.want) {
			t.Errorf("group update %s: %v, want %v", tc.name, err, tc.want)
		}
	}
	update(t, s, func(tx journal.Tx) error {
		g, err := journal.GetGroup(tx, "grp_a")
		if err != nil {
			return err
		}
		g.CanonicalNodeID, g.Generation = "node_c1", g.Generation+1
		if err := journal.UpdateGroup(tx, g); err != nil {
			return err
		}
		g.Generation = 1
		if err := journal.UpdateGroup(tx, g); !errors.Is(err, journal.ErrStaleGeneration) {
			t.Errorf("generation 2 → 1: %v, want ErrStaleGeneration", err)
		}
		return nil
	})

	// Corrupt stored bytes are ErrCorrupt, not a half-read record.
	for _, bad := range []string{`{bad`, `{"node_id":"node_bad","mystery":1}`, `{"node_id":"node_bad"} trailing`, `{"node_id":"node_bad","group_id":"grp_a","parents":[],"root_id":"zz","status":"draft","provenance":{"op":"x"},"visits":0,"value":0,"created_at":"2030-01-01T00:00:00Z"}`} {
		update(t, s, func(tx journal.Tx) error { return tx.Put([]byte("node/node_bad"), []byte(bad)) })
		view(t, s, func(r journal.Reader) error {
			if _, err := journal.GetNode(r, "node_bad"); !errors.Is(err, journal.ErrCorrupt) {
				t.Errorf("stored %s: %v, want ErrCorrupt", bad, err)
			}
			return nil
		})
	}
}

func nan() float64 { var z float64; return z / z }

func testRecordTransitions(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	seedGroup(t, s, "grp_a", "node_r")
	update(t, s, func(tx journal.Tx) error {
		if err := fork(tx, "grp_a", "node_d", "node_r"); err != nil {
			return err
		}
		return journal.CreateAttempt(tx, journal.Attempt{AttemptID: "att_1", NodeID: "node_d", GroupID: "grp_a", Executor: "runc", State: journal.AttemptQueued})
	})
	// Every other step updates from the record it read (UpdateReadNode):
	// the same rules hold.
	var step int
	setNode := func(change func(n *journal.Node)) error {
		step++
		return tryUpdate(s, func(tx journal.Tx) error {
			n, err := journal.GetNode(tx, "node_d")
			if err != nil {
				return err
			}
			old := n
			change(&n)
			if step%2 == 0 {
				return journal.UpdateReadNode(tx, old, n)
			}
			return journal.UpdateNode(tx, n)
		})
	}
	if err := tryUpdate(s, func(tx journal.Tx) error {
		r, err := journal.GetNode(tx, "node_r")
		if err != nil {
			return err
		}
		d, err := journal.GetNode(tx, "node_d")
		if err != nil {
			return err
		}
		return journal.UpdateReadNode(tx, r, d)
	}); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Errorf("UpdateReadNode from another node's record: %v, want ErrInvalidArgument", err)
	}
	steps := []struct {
		name   string
		change func(n *journal.Node)
		want   error
	}{
		{"draft → terminal", func(n *journal.Node) { n.Status = journal.NodeTerminal }, journal.ErrFailedPrecondition},
		{"draft parents change", func(n *journal.Node) { n.Parents = nil }, journal.ErrInvalidArgument},
		{"draft group change", func(n *journal.Node) { n.GroupID = "grp_b" }, journal.ErrInvalidArgument},
		{"draft stats", func(n *journal.Node) { n.Visits, n.Value = 1, 0.25 }, nil},
		{"seal with new root", func(n *journal.Node) {
			n.Status, n.RootID, n.LogicalState = journal.NodeSealed, rootB, json.RawMessage(`{"step":2}`)
			n.Provenance.AttemptID = "att_1"
		}, nil},
		{"sealed root change", func(n *journal.Node) { n.RootID = rootA }, journal.ErrInvalidArgument},
		{"sealed logical state change", func(n *journal.Node) { n.LogicalState = json.RawMessage(`{}`) }, journal.ErrInvalidArgument},
		{"sealed provenance change", func(n *journal.Node) { n.Provenance.Op = "merge" }, journal.ErrInvalidArgument},
		{"sealed → draft", func(n *journal.Node) { n.Status = journal.NodeDraft }, journal.ErrFailedPrecondition},
		{"sealed stats", func(n *journal.Node) { n.Visits++; n.Value += 1 }, nil},
		{"sealed → terminal", func(n *journal.Node) { n.Status = journal.NodeTerminal }, nil},
		{"terminal → pruned", func(n *journal.Node) { n.Status = journal.NodePruned }, nil},
		{"pruned → sealed", func(n *journal.Node) { n.Status = journal.NodeSealed }, journal.ErrFailedPrecondition},
	}
	for _, st := range steps {
		if err := setNode(st.change); !errors.Is(err, st.want) && !(err == nil && st.want == nil) {
			t.Errorf("%s: %v, want %v", st.name, err, st.want)
		}
	}
	view(t, s, func(r journal.Reader) error {
		n, err := journal.GetNode(r, "node_d")
		if err != nil {
			return err
		}
		if n.Status != journal.NodePruned || n.RootID != rootB || n.Visits != 2 || n.Value != 1.25 || string(n.LogicalState) != `{"step":2}` {
			t.Errorf("after the steps: %+v", n)
		}
		return nil
	})

	setAttempt := func(change func(a *journal.Attempt)) error {
		return tryUpdate(s, func(tx journal.Tx) error {
			a, err := journal.GetAttempt(tx, "att_1")
			if err != nil {
				return err
			}
			change(&a)
			return journal.UpdateAttempt(tx, a)
		})
	}
	to := func(st journal.AttemptState) func(a *journal.Attempt) {
		return func(a *journal.Attempt) { a.State = st }
	}
	asteps := []struct {
		name   string
		change func(a *journal.Attempt)
		want   error
	}{
		{"queued → sealed", to(journal.AttemptSealed), journal.ErrFailedPrecondition},
		{"queued → active", to(journal.AttemptActive), nil},
		{"executor change", func(a *journal.Attempt) { a.Executor = "wasi" }, journal.ErrInvalidArgument},
		{"node change", func(a *journal.Attempt) { a.NodeID = "node_r" }, journal.ErrInvalidArgument},
		{"active → quiescing", to(journal.AttemptQuiescing), nil},
		{"quiescing → released", to(journal.AttemptReleased), journal.ErrFailedPrecondition},
		{"keep-running seal: quiescing → active", to(journal.AttemptActive), nil},
		{"active → quiescing again", to(journal.AttemptQuiescing), nil},
		{"quiescing → sealed", func(a *journal.Attempt) { a.State, a.ResultNodeID = journal.AttemptSealed, "node_d" }, nil},
		{"sealed → failed", to(journal.AttemptFailed), journal.ErrFailedPrecondition},
		{"sealed → released", to(journal.AttemptReleased), nil},
		{"released → active", to(journal.AttemptActive), journal.ErrFailedPrecondition},
	}
	for _, st := range asteps {
		if err := setAttempt(st.change); !errors.Is(err, st.want) && !(err == nil && st.want == nil) {
			t.Errorf("%s: %v, want %v", st.name, err, st.want)
		}
	}
}

func testAncestors(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	seedGroup(t, s, "grp_a", "node_r")
	// r ─┬─ a ─┐
	//    └─ b ─┴─ m (merge) ── x
	update(t, s, func(tx journal.Tx) error {
		for _, f := range []struct {
			id      string
			parents []string
		}{
			{"node_a", []string{"node_r"}},
			{"node_b", []string{"node_r"}},
			{"node_m", []string{"node_a", "node_b"}},
			{"node_x", []string{"node_m"}},
		} {
			if err := fork(tx, "grp_a", f.id, f.parents...); err != nil {
				return err
			}
		}
		return nil
	})
	var got []string
	view(t, s, func(r journal.Reader) error {
		return journal.Ancestors(r, "node_x", func(n journal.Node) error { got = append(got, n.NodeID); return nil })
	})
	if fmt.Sprint(got) != "[node_m node_a node_b node_r]" {
		t.Errorf("Ancestors(node_x) = %v, want nearest first, each once", got)
	}
	got = nil
	view(t, s, func(r journal.Reader) error {
		return journal.Ancestors(r, "node_x", func(n journal.Node) error {
			got = append(got, n.NodeID)
			return journal.ErrStop
		})
	})
	if len(got) != 1 {
		t.Errorf("Ancestors stopped after one: %v", got)
	}
	view(t, s, func(r journal.Reader) error {
		err := journal.Ancestors(r, "node_r", func(n journal.Node) error {
			t.Errorf("root has ancestor %s", n.NodeID)
			return nil
		})
		if err != nil {
			t.Errorf("Ancestors(root): %v", err)
		}
		if err := journal.Ancestors(r, "node_nope", func(journal.Node) error { return nil }); !errors.Is(err, journal.ErrNotFound) {
			t.Errorf("Ancestors(missing): %v", err)
		}
		return nil
	})
}

func testLeases(t *testing.T, open func(*testing.T, Options) journal.Store) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := open(t, Options{Now: func() time.Time { return t0 }})
	seedGroup(t, s, "grp_a", "node_r")
	var tokens []uint64
	update(t, s, func(tx journal.Tx) error {
		for i, ttl := range []time.Duration{30 * time.Second, 10 * time.Second, 20 * time.Second} {
			att := fmt.Sprintf("att_%d", i)
			if err := journal.CreateAttempt(tx, journal.Attempt{AttemptID: att, NodeID: "node_r", GroupID: "grp_a", Executor: "none", State: journal.AttemptQueued}); err != nil {
				return err
			}
			tok, err := journal.NextFencingToken(tx)
			if err != nil {
				return err
			}
			tokens = append(tokens, tok)
			if err := journal.CreateLease(tx, journal.Lease{LeaseID: fmt.Sprintf("lease_%d", i), AttemptID: att, NodeID: "node_r", GroupID: "grp_a",
				Token: tok, TTLMillis: ttl.Milliseconds(), ExpiresAt: tx.Now().Add(ttl)}); err != nil {
				return err
			}
		}
		return nil
	})
	if fmt.Sprint(tokens) != "[1 2 3]" {
		t.Errorf("fencing tokens %v, want strictly increasing from 1", tokens)
	}
	expired := func(at time.Time) string {
		var ids []string
		view(t, s, func(r journal.Reader) error {
			return journal.ExpiredLeases(r, at, func(id string) error { ids = append(ids, id); return nil })
		})
		return fmt.Sprint(ids)
	}
	tests := []struct {
		at   time.Duration
		want string
	}{
		{0, "[]"},
		{10*time.Second - 1, "[]"},
		{10 * time.Second, "[lease_1]"},
		{25 * time.Second, "[lease_1 lease_2]"},
		{time.Hour, "[lease_1 lease_2 lease_0]"},
	}
	for _, tc := range tests {
		if got := expired(t0.Add(tc.at)); got != tc.want {
			t.Errorf("expired at +%v = %s, want %s", tc.at, got, tc.want)
		}
	}

	// Renew lease_1 past the others; its expiry index moves with it.
	update(t, s, func(tx journal.Tx) error {
		l, err := journal.GetLease(tx, "lease_1")
		if err != nil {
			return err
		}
		l.ExpiresAt = tx.Now().Add(time.Minute)
		if err := journal.UpdateLease(tx, l); err != nil {
			return err
		}
		l.Token++
		if err := journal.UpdateLease(tx, l); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("token change on renew: %v", err)
		}
		return nil
	})
	if got := expired(t0.Add(45 * time.Second)); got != "[lease_2 lease_0]" {
		t.Errorf("after renewing lease_1: expired at +45s = %s", got)
	}

	update(t, s, func(tx journal.Tx) error { return journal.DeleteLease(tx, "lease_2") })
	if err := tryUpdate(s, func(tx journal.Tx) error { return journal.DeleteLease(tx, "lease_2") }); !errors.Is(err, journal.ErrNotFound) {
		t.Errorf("second release: %v, want ErrNotFound", err)
	}
	view(t, s, func(r journal.Reader) error {
		ids, err := journal.LeasesOfNode(r, "node_r")
		if err != nil || fmt.Sprint(ids) != "[lease_0 lease_1]" {
			t.Errorf("LeasesOfNode = %v, %v", ids, err)
		}
		return nil
	})
	if got := expired(t0.Add(time.Hour)); got != "[lease_0 lease_1]" {
		t.Errorf("after releasing lease_2: expired = %s", got)
	}
	if err := tryUpdate(s, func(tx journal.Tx) error {
		return journal.CreateLease(tx, journal.Lease{LeaseID: "lease_x", AttemptID: "att_0", NodeID: "node_r", GroupID: "grp_a", TTLMillis: 1, ExpiresAt: t0})
	}); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Errorf("lease without token: %v", err)
	}
}
