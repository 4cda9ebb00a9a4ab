package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

func node(id string, status v1.NodeStatus, parents ...string) v1.Node {
	return v1.Node{NodeID: id, GroupID: "grp_g", Parents: parents, Status: status}
}

func TestRenderTree(t *testing.T) {
	nodes := []v1.Node{
		node("node_aaaaaaaaaaaa0001", v1.NodeSealed),
		node("node_aaaaaaaaaaaa0002", v1.NodeSealed, "node_aaaaaaaaaaaa0001"),
		node("node_aaaaaaaaaaaa0003", v1.NodeDraft, "node_aaaaaaaaaaaa0001"),
		node("node_aaaaaaaaaaaa0004", v1.NodeTerminal, "node_aaaaaaaaaaaa0002"),
		node("node_aaaaaaaaaaaa0005", v1.NodePruned, "node_aaaaaaaaaaaa0002"),
		node("node_aaaaaaaaaaaa0006", v1.NodeSealed, "node_aaaaaaaaaaaa0004", "node_aaaaaaaaaaaa0003"),
	}
	nodes[0].Visits, nodes[0].Value = 2, 1.5
	nodes[3].Visits, nodes[3].Value = 1, 1
	tv := &v1.TreeResponse{
		TreeView: v1.TreeView{
			Group: v1.Group{GroupID: "grp_g", RootNodeID: nodes[0].NodeID, CanonicalNodeID: nodes[3].NodeID, Generation: 4},
			Nodes: nodes,
		},
		Rewards: map[string]float64{nodes[3].NodeID: 1},
	}
	var out bytes.Buffer
	if err := renderTree(&out, tv); err != nil {
		t.Fatal(err)
	}
	want := `grp_g  generation 4  canonical node_aaaaaaaaaaaa0004  (6 nodes)
└── aaaa0001  sealed  visits=2 value=1.5
    ├── aaaa0002  sealed
    │   ├── *aaaa0004  terminal  reward=1  visits=1 value=1
    │   │   └── aaaa0006  sealed  parents=aaaa0004,aaaa0003
    │   └── aaaa0005  pruned
    └── aaaa0003  draft
* canonical
`
	if out.String() != want {
		t.Fatalf("tree:\n%s\nwant:\n%s", out.String(), want)
	}

	out.Reset()
	if err := renderDot(&out, tv); err != nil {
		t.Fatal(err)
	}
	dot := out.String()
	for _, want := range []string{
		`digraph "grp_g" {`,
		`"node_aaaaaaaaaaaa0004" [label="*aaaa0004\nterminal\nreward=1\nvisits=1 value=1", peripheries=2, penwidth=3];`,
		`"node_aaaaaaaaaaaa0003" [label="aaaa0003\ndraft", style=dashed];`,
		`"node_aaaaaaaaaaaa0005" [label="aaaa0005\npruned", color=grey, fontcolor=grey];`,
		`"node_aaaaaaaaaaaa0004" -> "node_aaaaaaaaaaaa0006";`,
		`"node_aaaaaaaaaaaa0003" -> "node_aaaaaaaaaaaa0006";`,
	} {
		if !strings.Contains(dot, want) {
			t.Errorf("dot lacks %s:\n%s", want, dot)
		}
	}
	if strings.Count(dot, " -> ") != 6 {
		t.Errorf("dot has %d edges, want 6", strings.Count(dot, " -> "))
	}
}

// TestRenderTreeDeepChain: a long chain renders without recursion and in
// linear space (indentation stops at maxTreeIndent).
func TestRenderTreeDeepChain(t *testing.T) {
	const n = 20_000
	nodes := make([]v1.Node, n)
	for i := range nodes {
		nodes[i] = node(journalID(i), v1.NodeSealed)
		if i > 0 {
			nodes[i].Parents = []string{nodes[i-1].NodeID}
		}
	}
	tv := &v1.TreeResponse{TreeView: v1.TreeView{Group: v1.Group{GroupID: "grp_g"}, Nodes: nodes}}
	var out bytes.Buffer
	if err := renderTree(&out, tv); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(out.String(), "\n"); lines != n+2 {
		t.Fatalf("%d lines, want %d", lines, n+2)
	}
	if out.Len() > n*(4*maxTreeIndent+60) {
		t.Fatalf("%d bytes for a chain of %d", out.Len(), n)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("(depth %d)\n", n-1)) {
		t.Fatal("the deepest node does not show its depth")
	}
}

func journalID(i int) string {
	const digits = "0123456789abcdefghjkmnpqrstvwxyz"
	b := []byte("node_0000000000")
	for j := len(b) - 1; i > 0; j-- {
		b[j] = digits[i%32]
		i /= 32
	}
	return string(b)
}

func TestShortIDs(t *testing.T) {
	// Same last 8 characters: the short form grows until it is unique.
	ids := shortIDs([]v1.Node{node("node_x1abcdefgh", ""), node("node_x2abcdefgh", ""), node("node_zz", "")})
	if ids["node_x1abcdefgh"] != "1abcdefgh" || ids["node_x2abcdefgh"] != "2abcdefgh" || ids["node_zz"] != "zz" {
		t.Fatalf("short ids %v", ids)
	}
}

// TestGraphVerbsInProcess runs the graph verbs against an in-process
// daemon: flags after arguments, evidence files whose names hold commas,
// and the hint that names a generated idempotency key when the outcome of
// a mutation is unknown.
func TestGraphVerbsInProcess(t *testing.T) {
	sock := daemon(t)
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := esfctl(t, sock, nil, "group", "create", "--from", src, "-o", "json")
	var g v1.CreateGroupResult
	if err := json.Unmarshal([]byte(r.stdout), &g); r.status != 0 || err != nil {
		t.Fatalf("group create: %+v %v", r, err)
	}
	r = esfctl(t, sock, nil, "fork", g.Node.NodeID, "-n", "2")
	if r.status != 0 || len(strings.Fields(r.stdout)) != 2 {
		t.Fatalf("fork with flags after the argument: %+v", r)
	}

	ev := filepath.Join(t.TempDir(), "a,b.log")
	if err := os.WriteFile(ev, []byte("log"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = esfctl(t, sock, nil, "evaluate", g.Node.NodeID, "--evaluator", "e@1", "--reward", "-1.5", "--verdict", "fail",
		"--evidence", ev, "--evidence", ev, "--terminal", "-o", "json")
	var e v1.Evaluation
	if err := json.Unmarshal([]byte(r.stdout), &e); r.status != 0 || err != nil {
		t.Fatalf("evaluate: %+v %v", r, err)
	}
	if len(e.Evidence) != 2 || e.Evidence[0] != e.Evidence[1] || e.Reward != -1.5 || !e.Terminal {
		t.Fatalf("evaluation %+v", e)
	}
	// A terminal node forks no more.
	if r := esfctl(t, sock, nil, "-o", "json", "fork", g.Node.NodeID); r.status != 6 {
		t.Fatalf("fork of a terminal node: %+v", r)
	}

	down := filepath.Join(t.TempDir(), "down.sock")
	r = esfctl(t, down, nil, "-o", "json", "fork", g.Node.NodeID)
	if r.status != 11 || !strings.Contains(jsonError(t, r).Message, "--idempotency-key esfctl-") {
		t.Fatalf("mutation against a daemon that is down: %+v", r)
	}
	r = esfctl(t, down, nil, "-o", "json", "fork", g.Node.NodeID, "--idempotency-key", "mine")
	if e := jsonError(t, r); r.status != 11 || strings.Contains(e.Message, "idempotency-key") {
		t.Fatalf("with the caller's own key, no hint: %+v", r)
	}
	if e := jsonError(t, esfctl(t, down, nil, "-o", "json", "inspect", g.Node.NodeID)); e.Code != errdefs.CodeUnavailable || strings.Contains(e.Message, "idempotency") {
		t.Fatalf("a read names no key: %+v", e)
	}
}
