package journal

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

var hexA = strings.Repeat("ab", 32)

func TestFingerprintCanonical(t *testing.T) {
	type req struct {
		Node  string          `json:"node"`
		State json.RawMessage `json:"state"`
		N     json.Number     `json:"n"`
	}
	fp := func(op string, r any) string {
		t.Helper()
		s, err := Fingerprint(op, r)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := fp("fork", req{Node: "node_a", State: json.RawMessage(`{"b":1, "a":{"y":2,"x":1}}`), N: "3"})
	same := []any{
		req{Node: "node_a", State: json.RawMessage("{ \"a\" : {\"x\":1,\"y\":2}, \"b\" : 1 }"), N: "3"},
		map[string]any{"n": json.Number("3"), "state": map[string]any{"a": map[string]int{"y": 2, "x": 1}, "b": 1}, "node": "node_a"},
	}
	for _, r := range same {
		if got := fp("fork", r); got != a {
			t.Errorf("equivalent request %v fingerprints differently", r)
		}
	}
	different := []struct {
		op string
		r  any
	}{
		{"evaluate", req{Node: "node_a", State: json.RawMessage(`{"b":1,"a":{"y":2,"x":1}}`), N: "3"}},
		{"fork", req{Node: "node_b", State: json.RawMessage(`{"b":1,"a":{"y":2,"x":1}}`), N: "3"}},
		{"fork", req{Node: "node_a", State: json.RawMessage(`{"b":2,"a":{"y":2,"x":1}}`), N: "3"}},
		{"fork", req{Node: "node_a", State: json.RawMessage(`{"b":1,"a":{"y":2,"x":1}}`), N: "3.0"}},
	}
	for _, d := range different {
		if fp(d.op, d.r) == a {
			t.Errorf("different request %s %v has the same fingerprint", d.op, d.r)
		}
	}
	if !strings.HasPrefix(a, "sha256:") || len(a) != len("sha256:")+64 {
		t.Errorf("fingerprint %q", a)
	}
	if _, err := Fingerprint("x", func() {}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("unencodable request: %v", err)
	}
}

func validNode() Node {
	return Node{NodeID: "node_a", GroupID: "grp_a", Parents: []string{"node_p"}, RootID: hexA, Status: NodeDraft,
		LogicalState: json.RawMessage(`{"k":[1,2]}`), Provenance: Provenance{Op: "fork", Environment: json.RawMessage(`{"image":"x"}`)},
		Visits: 3, Value: 1.5, CreatedAt: time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)}
}

func TestNodeValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Node)
	}{
		{"bad node id", func(n *Node) { n.NodeID = "grp_a" }},
		{"bad group id", func(n *Node) { n.GroupID = "" }},
		{"uppercase root", func(n *Node) { n.RootID = strings.ToUpper(hexA) }},
		{"short root", func(n *Node) { n.RootID = hexA[:62] }},
		{"bad status", func(n *Node) { n.Status = "" }},
		{"infinite value", func(n *Node) { n.Value = 1 / zero() }},
		{"bad logical state", func(n *Node) { n.LogicalState = json.RawMessage(`{"a"`) }},
		{"bad parent", func(n *Node) { n.Parents = []string{"node_a/b"} }},
		{"long source", func(n *Node) { n.Provenance.Source = strings.Repeat("s", maxTextLen+1) }},
		{"non-UTF-8 source", func(n *Node) { n.Provenance.Source = "\xff" }},
		{"provenance attempt of the wrong kind", func(n *Node) { n.Provenance.AttemptID = "node_x" }},
	}
	n := validNode()
	if err := n.Validate(); err != nil {
		t.Fatalf("valid node: %v", err)
	}
	for _, tc := range tests {
		n := validNode()
		tc.change(&n)
		if err := n.Validate(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tc.name, err)
		}
	}
}

func zero() float64 { return 0 }

// TestAttemptLabelsValidate: labels are optional, at most MaxLabels, with
// keys that are names and values that are text.
func TestAttemptLabelsValidate(t *testing.T) {
	valid := func() Attempt {
		return Attempt{AttemptID: "att_a", NodeID: "node_a", GroupID: "grp_a", Executor: "runc", State: AttemptActive,
			Labels: map[string]string{"metadata.run": "r1", "e2b.env_keys": ""}}
	}
	a := valid()
	if err := a.Validate(); err != nil {
		t.Fatalf("valid attempt: %v", err)
	}
	many := map[string]string{}
	for i := 0; i <= MaxLabels; i++ {
		many[strings.Repeat("k", i+1)] = "v"
	}
	for name, labels := range map[string]map[string]string{
		"too many":        many,
		"empty key":       {"": "v"},
		"long key":        {strings.Repeat("k", maxNameLen+1): "v"},
		"long value":      {"k": strings.Repeat("v", maxTextLen+1)},
		"non-UTF-8 value": {"k": "\xff"},
	} {
		a := valid()
		a.Labels = labels
		if err := a.Validate(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	n := validNode()
	b, err := encode("node", &n)
	if err != nil {
		t.Fatal(err)
	}
	var back Node
	if err := decode("node", b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := encode("node", &back)
	if !bytes.Equal(b, b2) {
		t.Errorf("round trip changed the encoding:\n%s\n%s", b, b2)
	}
	big := validNode()
	big.LogicalState = json.RawMessage(`"` + strings.Repeat("x", MaxValueSize) + `"`)
	if _, err := encode("node", &big); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("oversized node: %v", err)
	}
}

func TestEventFilterMatch(t *testing.T) {
	ev := Event{Type: "node.forked", GroupID: "grp_a", NodeID: "node_a", AttemptID: "att_a"}
	tests := []struct {
		f    EventFilter
		want bool
	}{
		{EventFilter{}, true},
		{EventFilter{GroupID: "grp_a"}, true},
		{EventFilter{GroupID: "grp_b"}, false},
		{EventFilter{NodeID: "node_b"}, false},
		{EventFilter{AttemptID: "att_a"}, true},
		{EventFilter{Types: []string{"node.*"}}, true},
		{EventFilter{Types: []string{"node.forked"}}, true},
		{EventFilter{Types: []string{"node.fork"}}, false},
		{EventFilter{Types: []string{"attempt.*", "group.created"}}, false},
		{EventFilter{GroupID: "grp_a", Types: []string{"*"}}, true},
	}
	for _, tc := range tests {
		if got := tc.f.Match(&ev); got != tc.want {
			t.Errorf("%+v.Match = %v, want %v", tc.f, got, tc.want)
		}
	}
}

// fuzzDecode decodes arbitrary bytes as a record: it must never panic, and
// whatever it accepts must re-encode and decode to the same encoding.
func fuzzDecode[T any, P interface {
	*T
	Validate() error
}](t *testing.T, b []byte) {
	var v T
	if err := decode("fuzz", b, P(&v)); err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode error %v is not ErrCorrupt", err)
		}
		return
	}
	enc, err := encode("fuzz", P(&v))
	if err != nil {
		if len(b) > MaxValueSize/2 {
			return // decodes, but too large to store: fine
		}
		t.Fatalf("accepted record does not re-encode: %v\n%s", err, b)
	}
	var again T
	if err := decode("fuzz", enc, P(&again)); err != nil {
		t.Fatalf("re-encoded record does not decode: %v\n%s", err, enc)
	}
	enc2, _ := encode("fuzz", P(&again))
	if !bytes.Equal(enc, enc2) {
		t.Fatalf("encoding not stable:\n%s\n%s", enc, enc2)
	}
}

func seedRecords(f *testing.F, vs ...any) {
	for _, v := range vs {
		b, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"node_id":"node_a","x":1}`))
	f.Add([]byte(`null`))
}

func FuzzDecodeNode(f *testing.F) {
	seedRecords(f, validNode())
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode[Node](t, b) })
}

func FuzzDecodeGroup(f *testing.F) {
	seedRecords(f, Group{GroupID: "grp_a", RootNodeID: "node_r", CanonicalNodeID: "node_r", Generation: 2, Policy: json.RawMessage(`{"a":1}`)})
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode[Group](t, b) })
}

func FuzzDecodeAttempt(f *testing.F) {
	seedRecords(f, Attempt{AttemptID: "att_a", NodeID: "node_a", GroupID: "grp_a", Executor: "runc", State: AttemptActive, LeaseID: "lease_a"})
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode[Attempt](t, b) })
}

func FuzzDecodeEvaluation(f *testing.F) {
	seedRecords(f, Evaluation{EvaluationID: "eval_a", NodeID: "node_a", GroupID: "grp_a", Evaluator: "e", EvaluatorVersion: "1", Reward: -0.5, Evidence: []string{hexA}})
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode[Evaluation](t, b) })
}

func FuzzDecodeLease(f *testing.F) {
	seedRecords(f, Lease{LeaseID: "lease_a", AttemptID: "att_a", NodeID: "node_a", GroupID: "grp_a", Token: 7, TTLMillis: 1000, ExpiresAt: time.Unix(2e9, 0)})
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode[Lease](t, b) })
}

func FuzzDecodeIdempotencyEntry(f *testing.F) {
	seedRecords(f, IdempotencyEntry{Key: "k", Op: "fork", Fingerprint: "sha256:" + strings.Repeat("0", 64), Result: json.RawMessage(`{"x":1}`)})
	seedRecords(f, IdempotencyEntry{Key: "k", Op: "fork", Fingerprint: "sha256:" + strings.Repeat("0", 64),
		ResultParts: 2, ResultSize: resultPartSize + 1, ResultDigest: "sha256:" + strings.Repeat("1", 64)})
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode[IdempotencyEntry](t, b) })
}

func FuzzDecodeAttemptRuntime(f *testing.F) {
	seedRecords(f, AttemptRuntime{AttemptID: "att_a", Worker: "w", PrivateDelta: "/x", Data: json.RawMessage(`[1]`)})
	f.Fuzz(func(t *testing.T, b []byte) { fuzzDecode[AttemptRuntime](t, b) })
}

// mapReader is a Reader over a map, for the typed getters alone.
type mapReader struct {
	Reader
	m map[string][]byte
}

func (r mapReader) Get(key []byte) ([]byte, error) {
	b, ok := r.m[string(key)]
	if !ok {
		return nil, ErrNotFound
	}
	return b, nil
}

// TestGetNodeJSON: the stored record as it is (the JSON GetNode decodes),
// ErrNotFound for an absent node, ErrCorrupt for bytes that are not a JSON
// object, ErrInvalidArgument for a malformed id.
func TestGetNodeJSON(t *testing.T) {
	n := validNode()
	rec, err := encode("node", &n)
	if err != nil {
		t.Fatal(err)
	}
	r := mapReader{m: map[string][]byte{
		string(recordKey(prefixNode, n.NodeID)): rec,
		string(recordKey(prefixNode, "node_b")): []byte(`{"node_id":`),
		string(recordKey(prefixNode, "node_c")): []byte(`[]`),
	}}
	got, err := GetNodeJSON(r, n.NodeID)
	if err != nil || !bytes.Equal(got, rec) {
		t.Fatalf("GetNodeJSON = %s, %v; want %s", got, err, rec)
	}
	if _, err := GetNodeJSON(r, "node_d"); !errors.Is(err, ErrNotFound) {
		t.Errorf("absent node: %v", err)
	}
	for _, id := range []string{"node_b", "node_c"} {
		if _, err := GetNodeJSON(r, id); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", id, err)
		}
	}
	if _, err := GetNodeJSON(r, "grp_a"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("group id: %v, want ErrInvalidArgument", err)
	}
}
