package journal

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestValidFastPath holds valid.go's predicates to the checks that explain
// a failure: a predicate may say no where its check finds nothing (Validate
// then returns the check's nil), but never yes where the check fails.
func TestValidFastPath(t *testing.T) {
	strs := []string{"", "a", "node_a", "node_", "node_A", "node_a/b", "nodea", "node__a", "grp_a", "att_a", "eval_a", "lease_a",
		"node_" + strings.Repeat("a", maxIDSuffix), "node_" + strings.Repeat("a", maxIDSuffix+1),
		"\xff", "a\x00b", "a\x7fb", "é", "a\u0085b", "\u2028", strings.Repeat("s", maxNameLen), strings.Repeat("s", maxNameLen+1),
		strings.Repeat("s", maxTextLen), strings.Repeat("s", maxTextLen+1), strings.Repeat("k", MaxIdempotencyKeyLen+1),
		hexA, strings.ToUpper(hexA), hexA[:62], hexA[:32], hexA[:16], hexA[:63] + "g"}
	short := func(s string) string { return s[:min(len(s), 40)] }
	for _, s := range strs {
		for _, k := range kinds {
			if idOK(k, s) && CheckID(k, s) != nil {
				t.Errorf("idOK(%s, %q) but %v", k, short(s), CheckID(k, s))
			}
		}
		for _, c := range []struct {
			name string
			ok   bool
			err  error
		}{
			{"hexOK", hexOK(s, 64), checkHexID(s, "x")},
			{"optHexOK/16", optHexOK(s, 16), checkOptHex(s, 16, "x")},
			{"optHexOK/32", optHexOK(s, 32), checkOptHex(s, 32, "x")},
			{"nameOK", nameOK(s), checkName(s, "x")},
			{"textOK", textOK(s), checkText(s, "x")},
			{"idempotencyKeyOK", idempotencyKeyOK(s), CheckIdempotencyKey(s)},
		} {
			if c.ok && c.err != nil {
				t.Errorf("%s(%q…) fails its check", c.name, short(s))
			}
		}
		if !idempotencyKeyOK(s) && CheckIdempotencyKey(s) == nil {
			t.Errorf("idempotencyKeyOK(%q…) is stricter than CheckIdempotencyKey", short(s))
		}
	}
	raws := []json.RawMessage{nil, json.RawMessage(`{}`), json.RawMessage(`{"a"`), json.RawMessage(`1 2`)}
	floats := []float64{0, 1.5, 1 / zero(), -1 / zero(), zero() / zero()}
	checkRecord := func(what string, r interface {
		ok() bool
		explain() error
	}) {
		t.Helper()
		if r.ok() {
			if err := r.explain(); err != nil {
				t.Errorf("%s: ok() but %.200v", short(what), err)
			}
		}
	}
	for _, s := range strs {
		for i, set := range []func(*Node){
			func(n *Node) { n.NodeID = s }, func(n *Node) { n.GroupID = s }, func(n *Node) { n.RootID = s },
			func(n *Node) { n.Status = NodeStatus(s) }, func(n *Node) { n.Parents = []string{s} },
			func(n *Node) { n.Parents = []string{"node_p", s} }, func(n *Node) { n.Provenance.Op = s },
			func(n *Node) { n.Provenance.Source = s }, func(n *Node) { n.Provenance.AttemptID = s },
			func(n *Node) { n.Provenance.Executor = s }, func(n *Node) { n.Provenance.IdempotencyKey = s },
			func(n *Node) { n.Provenance.TraceID = s },
		} {
			n := validNode()
			set(&n)
			checkRecord("node "+string(rune('a'+i))+" "+s, &n)
		}
		for i, set := range []func(*Evaluation){
			func(e *Evaluation) { e.EvaluationID = s }, func(e *Evaluation) { e.NodeID = s }, func(e *Evaluation) { e.AttemptID = s },
			func(e *Evaluation) { e.GroupID = s }, func(e *Evaluation) { e.Evaluator = s }, func(e *Evaluation) { e.EvaluatorVersion = s },
			func(e *Evaluation) { e.Verdict = s }, func(e *Evaluation) { e.Evidence = []string{hexA, s} },
		} {
			e := validEvaluation()
			set(&e)
			checkRecord("evaluation "+string(rune('a'+i))+" "+s, &e)
		}
		for i, set := range []func(*IdempotencyEntry){
			func(e *IdempotencyEntry) { e.Key = s }, func(e *IdempotencyEntry) { e.Op = s }, func(e *IdempotencyEntry) { e.Fingerprint = s },
			func(e *IdempotencyEntry) { e.ResultDigest = s },
		} {
			e := validEntry()
			set(&e)
			checkRecord("entry "+string(rune('a'+i))+" "+s, &e)
		}
		for i, set := range []func(*Event){
			func(ev *Event) { ev.Type = s }, func(ev *Event) { ev.GroupID = s }, func(ev *Event) { ev.NodeID = s },
			func(ev *Event) { ev.AttemptID = s }, func(ev *Event) { ev.LeaseID = s }, func(ev *Event) { ev.RootID = s },
			func(ev *Event) { ev.TraceID = s }, func(ev *Event) { ev.SpanID = s }, func(ev *Event) { ev.ParentSpanID = s },
			func(ev *Event) { ev.IdempotencyKey = s },
		} {
			ev := Event{Type: EventNodeForked, NodeID: "node_a"}
			set(&ev)
			checkRecord("event "+string(rune('a'+i))+" "+s, &ev)
		}
	}
	for _, raw := range raws {
		n := validNode()
		n.LogicalState = raw
		checkRecord("node logical_state "+string(raw), &n)
		n = validNode()
		n.Provenance.Environment = raw
		checkRecord("node environment "+string(raw), &n)
		ev := Event{Type: EventNodeForked, Data: raw}
		checkRecord("event data "+string(raw), &ev)
		e := validEntry()
		e.Result = raw
		checkRecord("entry result "+string(raw), &e)
	}
	for _, f := range floats {
		n := validNode()
		n.Value = f
		checkRecord("node value", &n)
		e := validEvaluation()
		e.Reward = f
		checkRecord("evaluation reward", &e)
	}
	n := validNode()
	n.Parents = []string{"node_p", "node_p"}
	checkRecord("repeated parent", &n)
	n.Parents = []string{n.NodeID}
	checkRecord("self parent", &n)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, sizes := range [][3]int64{{0, 0, 0}, {1, 10, 0}, {1, InlineResultSize + 1, 0}, {2, InlineResultSize + 1, 0}, {1, MaxResultSize + 1, 0}, {1, 10, 10}} {
		e := validEntry()
		e.ResultParts, e.ResultSize = int(sizes[0]), sizes[1]
		if sizes[2] == 0 {
			e.Result = nil
		}
		e.ResultDigest = "sha256:" + hexA
		checkRecord("entry parts", &e)
		e.ExpiresAt = now
		e.CreatedAt = now
		checkRecord("entry expiry", &e)
	}
	// The valid records themselves take the fast path.
	if v := validNode(); !v.ok() {
		t.Error("a valid node is not ok()")
	}
	if v := validEvaluation(); !v.ok() {
		t.Error("a valid evaluation is not ok()")
	}
	if v := validEntry(); !v.ok() {
		t.Error("a valid idempotency entry is not ok()")
	}
}

func validEvaluation() Evaluation {
	return Evaluation{EvaluationID: "eval_a", NodeID: "node_a", GroupID: "grp_a", Evaluator: "tests", EvaluatorVersion: "1",
		Reward: 0.5, Verdict: "ok", Evidence: []string{hexA}}
}

func validEntry() IdempotencyEntry {
	return IdempotencyEntry{Key: "k-1", Op: "fork", Fingerprint: "sha256:" + hexA, Result: json.RawMessage(`{"a":1}`)}
}

// TestProvenanceEqualSeesEveryField: provenanceEqual's fast path compares
// Provenance field by field; a new field must be added there.
func TestProvenanceEqualSeesEveryField(t *testing.T) {
	if n := reflect.TypeFor[Provenance]().NumField(); n != 7 {
		t.Fatalf("Provenance has %d fields; compare the new ones in provenanceEqual and update this test", n)
	}
}
