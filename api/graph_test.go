package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/testenv"
)

// rawJSON posts body to path and returns the status, the body and the
// response headers.
func (h *harness) rawJSON(t *testing.T, path, key, body string) (int, []byte, map[string]string) {
	t.Helper()
	hdr := map[string]string{}
	if key != "" {
		hdr[v1.HeaderIdempotencyKey] = key
	}
	resp := h.raw(t, "POST", path, v1.MediaJSON, hdr, strings.NewReader(body))
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, map[string]string{
		v1.HeaderIdempotencyKey: resp.Header.Get(v1.HeaderIdempotencyKey),
		"Content-Type":          resp.Header.Get("Content-Type"),
	}
}

func compact(t *testing.T, b []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	return buf.String()
}

func errorCode(t *testing.T, b []byte) errdefs.Code {
	t.Helper()
	var e errdefs.Error
	if err := json.Unmarshal(b, &e); err != nil || e.Message == "" {
		t.Fatalf("not an error body: %s (%v)", b, err)
	}
	return e.Code
}

// newSource writes a small tree and returns its absolute path.
func newSource(t *testing.T, files map[string]string) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	writeTree(t, src, files)
	return src
}

func TestGraphEndpoints(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	src := newSource(t, map[string]string{"a.txt": "alpha", "d/b.txt": "beta"})

	// From a source path: imported, then created.
	g, err := h.client.CreateGroup(ctx, v1.CreateGroupRequest{Source: src, LogicalState: json.RawMessage(`{"step":0}`)}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if g.Group.Generation != 1 || g.Group.CanonicalNodeID != g.Node.NodeID || g.Node.Status != v1.NodeSealed ||
		g.Node.Provenance.Source != src || compact(t, g.Node.LogicalState) != `{"step":0}` {
		t.Fatalf("create group from source: %+v", g)
	}
	// From the root id it got: same root, another group.
	g2, err := h.client.CreateGroup(ctx, v1.CreateGroupRequest{RootID: g.Node.RootID}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if g2.Node.RootID != g.Node.RootID || g2.Group.GroupID == g.Group.GroupID {
		t.Fatalf("create group from root: %+v", g2)
	}

	root := g.Node.NodeID
	fork, err := h.client.Fork(ctx, v1.ForkRequest{NodeID: root, N: 3}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fork.Nodes) != 3 {
		t.Fatalf("fork -n 3: %d nodes", len(fork.Nodes))
	}
	for _, n := range fork.Nodes {
		if n.Status != v1.NodeDraft || n.RootID != g.Node.RootID || len(n.Parents) != 1 || n.Parents[0] != root {
			t.Fatalf("forked node %+v", n)
		}
	}
	// Forking a draft is failed_precondition.
	if _, err := h.client.Fork(ctx, v1.ForkRequest{NodeID: fork.Nodes[0].NodeID}, client.CallOptions{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fork of a draft: %v", err)
	}

	in, err := h.client.Inspect(ctx, root, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if in.Kind != "node" || in.Node == nil || len(in.Node.Children) != 3 {
		t.Fatalf("inspect root node: %+v", in.Node)
	}
	// The raw JSON of a node carries the view's own fields beside the
	// node's.
	var raw []byte
	in, err = h.client.Inspect(ctx, fork.Nodes[1].NodeID, client.CallOptions{Raw: &raw})
	if err != nil {
		t.Fatal(err)
	}
	var shape struct {
		Kind string                     `json:"kind"`
		Node map[string]json.RawMessage `json:"node"`
	}
	if err := json.Unmarshal(raw, &shape); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"node_id", "parents", "root_id", "status", "provenance", "visits", "value",
		"ancestry", "children", "attempts", "leases", "evaluations"} {
		if _, ok := shape.Node[k]; !ok {
			t.Errorf("inspect JSON lacks node.%s: %s", k, raw)
		}
	}
	if shape.Kind != "node" || compact(t, shape.Node["ancestry"]) != `["`+root+`"]` || len(in.Node.Ancestry) != 1 {
		t.Fatalf("inspect of a child: %s", raw)
	}
	in, err = h.client.Inspect(ctx, g.Group.GroupID, client.CallOptions{})
	if err != nil || in.Kind != "group" || in.Group.Nodes != 4 {
		t.Fatalf("inspect group: %+v, %v", in, err)
	}

	// Evidence is any bytes, stored as one object.
	ev, err := h.client.PutEvidence(ctx, strings.NewReader("test log: 3 passed"), client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID != v1.ID(cas.Sum([]byte("test log: 3 passed"))) || ev.Size != 18 || !ev.New {
		t.Fatalf("evidence: %+v", ev)
	}
	again, err := h.client.PutEvidence(ctx, strings.NewReader("test log: 3 passed"), client.CallOptions{})
	if err != nil || again.ID != ev.ID || again.New {
		t.Fatalf("same evidence again: %+v, %v", again, err)
	}
	e, err := h.client.Evaluate(ctx, v1.EvaluateRequest{Target: root, Evaluator: "pytest@8.1", Reward: 0.75,
		Verdict: "pass", Evidence: []string{ev.ID.String()}, Backprop: true}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if e.NodeID != root || e.Evaluator != "pytest" || e.EvaluatorVersion != "8.1" || len(e.Evidence) != 1 {
		t.Fatalf("evaluation: %+v", e)
	}
	tree, err := h.client.Tree(ctx, g.Group.GroupID, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tree.Nodes) != 4 || tree.Rewards[root] != 0.75 || len(tree.Rewards) != 1 || tree.Group.GroupID != g.Group.GroupID {
		t.Fatalf("tree: %+v", tree)
	}
	if tree.Nodes[0].Visits != 1 || tree.Nodes[0].Value != 0.75 {
		t.Fatalf("backprop did not reach the root: %+v", tree.Nodes[0])
	}
	checkTreePassThrough(t, h, g.Group.GroupID)

	// Promote: a stale generation is stale_generation; the right one moves it.
	_, err = h.client.Promote(ctx, v1.PromoteRequest{GroupID: g.Group.GroupID, NodeID: root, ExpectedGeneration: 7}, client.CallOptions{})
	if !errors.Is(err, errdefs.ErrStaleGeneration) {
		t.Fatalf("stale promote: %v", err)
	}
	pg, err := h.client.Promote(ctx, v1.PromoteRequest{GroupID: g.Group.GroupID, NodeID: root, ExpectedGeneration: 1}, client.CallOptions{})
	if err != nil || pg.Generation != 2 {
		t.Fatalf("promote: %+v, %v", pg, err)
	}

	pr, err := h.client.Prune(ctx, v1.PruneRequest{NodeID: fork.Nodes[2].NodeID}, client.CallOptions{})
	if err != nil || len(pr.Pruned) != 1 || pr.Pruned[0] != fork.Nodes[2].NodeID {
		t.Fatalf("prune: %+v, %v", pr, err)
	}
	if _, err := h.client.Inspect(ctx, "node_unknown0", client.CallOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("inspect unknown: %v", err)
	}
}

// TestIdempotencyOverHTTP: a replay with the same key returns the same
// bytes, a different request under that key is a conflict, and a mutation
// sent without a key gets one back in the response header.
func TestIdempotencyOverHTTP(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	src := newSource(t, map[string]string{"f": "x"})
	st, body, hdr := h.rawJSON(t, "/v1/groups", "", `{"source":"`+src+`"}`)
	if st != 200 || !strings.HasPrefix(hdr[v1.HeaderIdempotencyKey], "api-") {
		t.Fatalf("create group: %d %s, key %q", st, body, hdr[v1.HeaderIdempotencyKey])
	}
	var g fabric.CreateGroupResult
	if err := json.Unmarshal(body, &g); err != nil {
		t.Fatal(err)
	}
	// The generated key replays too.
	st, replay, _ := h.rawJSON(t, "/v1/groups", hdr[v1.HeaderIdempotencyKey], `{"source":"`+src+`"}`)
	if st != 200 || !bytes.Equal(replay, body) {
		t.Fatalf("replay under the generated key: %d\n%s\nwant\n%s", st, replay, body)
	}

	req := `{"node_id":"` + g.Node.NodeID + `","n":2}`
	st, first, hdr := h.rawJSON(t, "/v1/fork", "fork-1", req)
	if st != 200 || hdr[v1.HeaderIdempotencyKey] != "fork-1" {
		t.Fatalf("fork: %d %s (key %q)", st, first, hdr[v1.HeaderIdempotencyKey])
	}
	// Same request, other spacing and field order: the same request.
	st, second, _ := h.rawJSON(t, "/v1/fork", "fork-1", ` { "n" : 2, "node_id" : "`+g.Node.NodeID+`" } `)
	if st != 200 || !bytes.Equal(first, second) {
		t.Fatalf("replay: %d\n%s\nwant\n%s", st, second, first)
	}
	st, third, _ := h.rawJSON(t, "/v1/fork", "fork-1", `{"node_id":"`+g.Node.NodeID+`","n":3}`)
	if st != 409 || errorCode(t, third) != errdefs.CodeConflict {
		t.Fatalf("other request under the same key: %d %s", st, third)
	}
	// The same key on another operation is a conflict too.
	st, fourth, _ := h.rawJSON(t, "/v1/prune", "fork-1", `{"node_id":"`+g.Node.NodeID+`"}`)
	if st != 409 || errorCode(t, fourth) != errdefs.CodeConflict {
		t.Fatalf("same key, other operation: %d %s", st, fourth)
	}
	tree, err := h.client.Tree(context.Background(), g.Group.GroupID, client.CallOptions{})
	if err != nil || len(tree.Nodes) != 3 {
		t.Fatalf("replays forked again: %d nodes, %v", len(tree.Nodes), err)
	}
}

// TestGeneratedKeyExpires: a key the server made up for a request that
// sent none is kept GeneratedKeyTTL, then the daemon forgets it; a
// caller's key is kept. Time passes on the fabric's clock (Options.Now).
func TestGeneratedKeyExpires(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	h := newHarness(t, 5*time.Second, func(o *fabric.Options) {
		o.GeneratedKeyTTL = time.Hour
		o.Now = func() time.Time { return time.Unix(0, clock.Load()) }
	})
	src := newSource(t, map[string]string{"f": "x"})
	body := `{"source":"` + src + `"}`
	st, made, hdr := h.rawJSON(t, "/v1/groups", "", body)
	if st != 200 || !strings.HasPrefix(hdr[v1.HeaderIdempotencyKey], "api-") {
		t.Fatalf("create group: %d %s, key %q", st, made, hdr[v1.HeaderIdempotencyKey])
	}
	st, mine, _ := h.rawJSON(t, "/v1/groups", "mine", body)
	if st != 200 {
		t.Fatalf("create group under a caller's key: %d %s", st, mine)
	}
	clock.Add(int64(time.Hour - time.Nanosecond))
	if n, err := h.f.ExpireIdempotencyKeys(context.Background()); err != nil || n != 0 {
		t.Fatalf("expire before the ttl: %d keys, %v; want none", n, err)
	}
	clock.Add(int64(time.Nanosecond))
	if n, err := h.f.ExpireIdempotencyKeys(context.Background()); err != nil || n != 1 {
		t.Fatalf("expire: %d keys, %v; want the made-up one", n, err)
	}
	if st, again, _ := h.rawJSON(t, "/v1/groups", hdr[v1.HeaderIdempotencyKey], body); st != 200 || bytes.Equal(again, made) {
		t.Fatalf("the expired made-up key replayed: %d %s", st, again)
	}
	if st, again, _ := h.rawJSON(t, "/v1/groups", "mine", body); st != 200 || !bytes.Equal(again, mine) {
		t.Fatalf("a caller's key did not replay: %d %s", st, again)
	}
	// A key the client made up and says so expires too; the header is
	// "true" with a key, or absent.
	if _, err := h.client.CreateGroup(context.Background(), v1.CreateGroupRequest{Source: src},
		client.CallOptions{IdempotencyKey: "client-made", KeyGenerated: true}); err != nil {
		t.Fatal(err)
	}
	clock.Add(int64(time.Hour))
	if n, err := h.f.ExpireIdempotencyKeys(context.Background()); err != nil || n != 1 {
		t.Fatalf("expire: %d keys, %v; want the client's made-up one", n, err)
	}
	for _, hdr := range []map[string]string{
		{v1.HeaderKeyGenerated: "yes", v1.HeaderIdempotencyKey: "k"},
		{v1.HeaderKeyGenerated: "true"},
	} {
		resp := h.raw(t, "POST", "/v1/groups", v1.MediaJSON, hdr, strings.NewReader(body))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || errorCode(t, b) != errdefs.CodeInvalidArgument {
			t.Errorf("%v: %d %s", hdr, resp.StatusCode, b)
		}
	}
}

func TestGraphErrorResponses(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	src := newSource(t, map[string]string{"f": "x"})
	g, err := h.client.CreateGroup(context.Background(), v1.CreateGroupRequest{Source: src}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fork, err := h.client.Fork(context.Background(), v1.ForkRequest{NodeID: g.Node.NodeID}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node, draft, group := g.Node.NodeID, fork.Nodes[0].NodeID, g.Group.GroupID
	unknownNode := "node_0000000000000000000000000z"
	tests := []struct {
		name, method, path, ctype, body string
		status                          int
		code                            errdefs.Code
	}{
		{"malformed JSON", "POST", "/v1/fork", v1.MediaJSON, `{"node_id":`, 400, errdefs.CodeInvalidArgument},
		{"unknown field", "POST", "/v1/fork", v1.MediaJSON, `{"node":"` + node + `"}`, 400, errdefs.CodeInvalidArgument},
		{"wrong content type", "POST", "/v1/fork", "text/plain", `{"node_id":"` + node + `"}`, 400, errdefs.CodeInvalidArgument},
		{"unknown node", "POST", "/v1/fork", v1.MediaJSON, `{"node_id":"` + unknownNode + `"}`, 404, errdefs.CodeNotFound},
		{"fork a draft", "POST", "/v1/fork", v1.MediaJSON, `{"node_id":"` + draft + `"}`, 412, errdefs.CodeFailedPrecondition},
		{"fork too many", "POST", "/v1/fork", v1.MediaJSON, `{"node_id":"` + node + `","n":100000}`, 400, errdefs.CodeInvalidArgument},
		{"group without source", "POST", "/v1/groups", v1.MediaJSON, `{}`, 400, errdefs.CodeInvalidArgument},
		{"group relative source", "POST", "/v1/groups", v1.MediaJSON, `{"source":"rel/dir"}`, 400, errdefs.CodeInvalidArgument},
		{"group missing source", "POST", "/v1/groups", v1.MediaJSON, `{"source":"/nonexistent/esf"}`, 404, errdefs.CodeNotFound},
		{"group unknown root", "POST", "/v1/groups", v1.MediaJSON, `{"root_id":"` + cas.Sum([]byte("no")).String() + `"}`, 404, errdefs.CodeNotFound},
		{"stale generation", "POST", "/v1/promote", v1.MediaJSON, `{"group_id":"` + group + `","node_id":"` + node + `","expected_generation":9}`, 409, errdefs.CodeStaleGeneration},
		{"inspect malformed", "GET", "/v1/inspect/nope", "", "", 400, errdefs.CodeInvalidArgument},
		{"inspect unknown", "GET", "/v1/inspect/" + unknownNode, "", "", 404, errdefs.CodeNotFound},
		{"tree of a node id", "GET", "/v1/tree/" + node, "", "", 400, errdefs.CodeInvalidArgument},
		{"evaluate a draft", "POST", "/v1/evaluate", v1.MediaJSON, `{"target":"` + draft + `","evaluator":"e@1","reward":1,"verdict":"ok"}`, 412, errdefs.CodeFailedPrecondition},
		{"evaluate bad evaluator", "POST", "/v1/evaluate", v1.MediaJSON, `{"target":"` + node + `","evaluator":"e","reward":1}`, 400, errdefs.CodeInvalidArgument},
		{"evaluate unknown evidence", "POST", "/v1/evaluate", v1.MediaJSON, `{"target":"` + node + `","evaluator":"e@1","evidence":["` + cas.Sum([]byte("?")).String() + `"]}`, 404, errdefs.CodeNotFound},
		{"prune the root", "POST", "/v1/prune", v1.MediaJSON, `{"node_id":"` + node + `"}`, 412, errdefs.CodeFailedPrecondition},
		{"mount relative dir", "POST", "/v1/mount", v1.MediaJSON, `{"node_id":"` + node + `","dir":"rel"}`, 400, errdefs.CodeInvalidArgument},
		{"umount nothing", "POST", "/v1/umount", v1.MediaJSON, `{"dir":"` + t.TempDir() + `"}`, 404, errdefs.CodeNotFound},
		{"release unknown", "POST", "/v1/release", v1.MediaJSON, `{"attempt_id":"att_00000000000000000000000000"}`, 404, errdefs.CodeNotFound},
		{"renew unknown", "POST", "/v1/renew", v1.MediaJSON, `{"lease_id":"lease_00000000000000000000000000","token":1}`, 404, errdefs.CodeNotFound},
		{"events unknown parameter", "GET", "/v1/events?grup=x", "", "", 400, errdefs.CodeInvalidArgument},
		{"events bad after", "GET", "/v1/events?after=-1", "", "", 400, errdefs.CodeInvalidArgument},
		{"events bad group", "GET", "/v1/events?group=" + node, "", "", 400, errdefs.CodeInvalidArgument},
		{"events repeated after", "GET", "/v1/events?after=1&after=2", "", "", 400, errdefs.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			resp := h.raw(t, tt.method, tt.path, tt.ctype, nil, body)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d (%s)", resp.StatusCode, tt.status, b)
			}
			if got := errorCode(t, b); got != tt.code {
				t.Errorf("code %s, want %s (%s)", got, tt.code, b)
			}
		})
	}
}

func requireMounts(t *testing.T) {
	t.Helper()
	testenv.Require(t, "root", "fuse", "overlay")
}

// TestAttemptEndpoints drives an attempt through the client: activate,
// write, suspend into the draft, a new attempt on the result sees the
// write; renew with a stale token; release; a read-only mount and umount.
// On the fakes: that the view is read-only is fabric's to prove
// (TestMountReadOnlyAndRW, on real mounts).
func TestAttemptEndpoints(t *testing.T) {
	h := newHarness(t, 5*time.Second, onFakes)
	ctx := context.Background()
	src := newSource(t, map[string]string{"base.txt": "base"})
	g, err := h.client.CreateGroup(ctx, v1.CreateGroupRequest{Source: src}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fork, err := h.client.Fork(ctx, v1.ForkRequest{NodeID: g.Node.NodeID}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	draft := fork.Nodes[0].NodeID
	a, err := h.client.Activate(ctx, v1.ActivateRequest{NodeID: draft, TTLMillis: 60_000}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.State != v1.AttemptActive || a.Root == "" || a.Lease == nil || a.Lease.TTLMillis != 60_000 {
		t.Fatalf("activate: %+v", a)
	}
	if err := os.WriteFile(filepath.Join(a.Root, "new.txt"), []byte("written in the attempt"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Renew(ctx, v1.RenewRequest{LeaseID: a.LeaseID, Token: a.Lease.Token + 1}, client.CallOptions{}); !errors.Is(err, errdefs.ErrStaleGeneration) {
		t.Fatalf("renew with a stale token: %v", err)
	}
	l, err := h.client.Renew(ctx, v1.RenewRequest{LeaseID: a.LeaseID, Token: a.Lease.Token, TTLMillis: 120_000}, client.CallOptions{})
	if err != nil || l.TTLMillis != 120_000 {
		t.Fatalf("renew: %+v, %v", l, err)
	}
	sus, err := h.client.Suspend(ctx, v1.SuspendRequest{AttemptID: a.AttemptID, LogicalState: json.RawMessage(`{"done":true}`)}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sus.Node.NodeID != draft || sus.Node.Status != v1.NodeSealed || sus.Attempt.State != v1.AttemptReleased {
		t.Fatalf("suspend: %+v", sus)
	}
	b, err := h.client.Activate(ctx, v1.ActivateRequest{NodeID: draft}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(b.Root, "new.txt")); err != nil || string(got) != "written in the attempt" {
		t.Fatalf("the sealed write in a new attempt: %q, %v", got, err)
	}
	rel, err := h.client.Release(ctx, v1.ReleaseRequest{AttemptID: b.AttemptID}, client.CallOptions{})
	if err != nil || rel.State != v1.AttemptReleased {
		t.Fatalf("release: %+v, %v", rel, err)
	}

	dir := t.TempDir()
	m, err := h.client.Mount(ctx, v1.MountRequest{NodeID: draft, Dir: dir}, client.CallOptions{})
	if err != nil || m.RootID != sus.Node.RootID {
		t.Fatalf("mount: %+v, %v", m, err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "new.txt")); err != nil || string(got) != "written in the attempt" {
		t.Fatalf("read-only mount: %q, %v", got, err)
	}
	if _, err := h.client.Umount(ctx, v1.UmountRequest{Dir: dir}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
}

// checkTreePassThrough: GET /v1/tree passes the node records through as
// stored (fabric.TreeRecords) and must answer exactly what decoding them
// gave: the same v1.TreeResponse as fabric.Tree and LatestRewards, each
// node byte for byte the JSON of its v1.Node.
func checkTreePassThrough(t *testing.T, h *harness, groupID string) {
	t.Helper()
	ctx := context.Background()
	var raw []byte
	got, err := h.client.Tree(ctx, groupID, client.CallOptions{Raw: &raw})
	if err != nil {
		t.Fatal(err)
	}
	tv, err := h.f.Tree(ctx, groupID)
	if err != nil {
		t.Fatal(err)
	}
	rewards, err := h.f.LatestRewards(ctx, groupID)
	if err != nil {
		t.Fatal(err)
	}
	if want := (v1.TreeResponse{TreeView: treeView(tv), Rewards: rewards}); !reflect.DeepEqual(*got, want) {
		t.Fatalf("tree answer\n%+v\nwant\n%+v", got, want)
	}
	// RawOnly: the same bytes, nothing decoded.
	var only []byte
	zero, err := h.client.Tree(ctx, groupID, client.CallOptions{Raw: &only, RawOnly: true})
	if err != nil || !bytes.Equal(only, raw) || zero.Group.GroupID != "" || zero.Nodes != nil {
		t.Fatalf("RawOnly: %v, %d bytes (want %d), result %+v", err, len(only), len(raw), zero)
	}
	var nodes struct{ Nodes []json.RawMessage }
	if err := json.Unmarshal(raw, &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes.Nodes) != len(tv.Nodes) {
		t.Fatalf("%d nodes, want %d", len(nodes.Nodes), len(tv.Nodes))
	}
	for i, n := range tv.Nodes {
		want, err := json.Marshal(nodeView(n))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(nodes.Nodes[i], want) {
			t.Errorf("node %d:\n%s\nwant\n%s", i, nodes.Nodes[i], want)
		}
	}
}
