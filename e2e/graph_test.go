package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// decode parses esfctl -o json output into v.
func decode(t *testing.T, r result, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("stdout is not the JSON expected: %v\n%s", err, r.stdout)
	}
}

// compact is b without insignificant space (esfctl -o json prints the
// daemon's indented JSON).
func compact(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(b)
	}
	return buf.String()
}

// smallTree writes a few files into a new directory under the daemon's
// directory and returns it.
func smallTree(t *testing.T, d *daemon, files map[string]string) string {
	t.Helper()
	dir, err := os.MkdirTemp(filepath.Dir(d.state), "src-")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

type groupJSON struct {
	Group struct {
		GroupID         string `json:"group_id"`
		CanonicalNodeID string `json:"canonical_node_id"`
		Generation      uint64 `json:"generation"`
	} `json:"group"`
	Node nodeJSON `json:"node"`
}

type nodeJSON struct {
	NodeID       string          `json:"node_id"`
	GroupID      string          `json:"group_id"`
	Parents      []string        `json:"parents"`
	RootID       string          `json:"root_id"`
	Status       string          `json:"status"`
	LogicalState json.RawMessage `json:"logical_state"`
	Visits       uint64          `json:"visits"`
	Value        float64         `json:"value"`
	Provenance   struct {
		Op     string `json:"op"`
		Source string `json:"source"`
	} `json:"provenance"`
}

// createGroup runs group create --from src -o json.
func createGroup(t *testing.T, d *daemon, src string, args ...string) groupJSON {
	t.Helper()
	var g groupJSON
	decode(t, d.mustCtl(nil, append([]string{"-o", "json", "group", "create", "--from", src}, args...)...), &g)
	if g.Group.GroupID == "" || g.Node.NodeID == "" || g.Node.Status != "sealed" {
		t.Fatalf("group create: %+v", g)
	}
	return g
}

// fork runs fork NODE -n n and returns the new node ids (human output).
func fork(t *testing.T, d *daemon, node string, n int, args ...string) []string {
	t.Helper()
	r := d.mustCtl(nil, append([]string{"fork", node, "-n", strconv.Itoa(n)}, args...)...)
	ids := strings.Fields(r.stdout)
	if len(ids) != n {
		t.Fatalf("fork -n %d printed %q", n, r.stdout)
	}
	return ids
}

func jsonNumber(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func inspectNode(t *testing.T, d *daemon, id string) (nodeJSON, map[string]json.RawMessage) {
	t.Helper()
	var v struct {
		Kind string          `json:"kind"`
		Node json.RawMessage `json:"node"`
	}
	decode(t, d.mustCtl(nil, "inspect", id, "-o", "json"), &v)
	if v.Kind != "node" {
		t.Fatalf("inspect %s: kind %q", id, v.Kind)
	}
	var n nodeJSON
	var all map[string]json.RawMessage
	if err := json.Unmarshal(v.Node, &n); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(v.Node, &all); err != nil {
		t.Fatal(err)
	}
	return n, all
}

// TestGraphVerbs drives the graph through the real CLI: group create from a
// directory, a tar on stdin and a root id; fork; tree (ASCII, dot, JSON);
// inspect; promote with a stale and a current generation; evaluate with
// evidence and backprop; prune; and the exit status of each bad input.
func TestGraphVerbs(t *testing.T) {
	d := startDaemon(t)
	src := smallTree(t, d, map[string]string{"README": "hello\n", "src/main.go": "package main\n"})

	// Human output of group create names the group, node and root.
	r := d.mustCtl(nil, "group", "create", "--from", src, "--logical-state", `{"step":0}`, "--policy", `{"max_attempts":3}`)
	for _, want := range []string{"group_id", "grp_", "node_", "root_id", "generation  1"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("group create output lacks %q:\n%s", want, r.stdout)
		}
	}
	g := createGroup(t, d, src)
	if g.Node.Provenance.Source != src || g.Group.Generation != 1 || g.Group.CanonicalNodeID != g.Node.NodeID {
		t.Fatalf("group from a directory: %+v", g)
	}
	// The same tree as a tar on stdin, and by its root id: the same root.
	tarOut, err := exec.Command("tar", "--format=posix", "-C", src, "-c", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	var fromTar groupJSON
	decode(t, d.mustCtl(bytes.NewReader(tarOut), "group", "create", "--from", "-", "-o", "json"), &fromTar)
	fromID := createGroup(t, d, g.Node.RootID)
	if fromTar.Node.RootID != g.Node.RootID || fromID.Node.RootID != g.Node.RootID || fromID.Group.GroupID == g.Group.GroupID {
		t.Fatalf("roots: dir %s, tar %s, id %s", g.Node.RootID, fromTar.Node.RootID, fromID.Node.RootID)
	}

	root := g.Node.NodeID
	kids := fork(t, d, root, 3, "--logical-state", `{"step":1}`)

	// tree: canonical marked, children indented under the root.
	r = d.mustCtl(nil, "tree", g.Group.GroupID)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 6 || !strings.Contains(lines[0], g.Group.GroupID) || !strings.Contains(lines[0], "generation 1") {
		t.Fatalf("tree output:\n%s", r.stdout)
	}
	if !strings.HasPrefix(lines[1], "└── *") || !strings.Contains(lines[1], "sealed") || !strings.HasSuffix(root, strings.Fields(strings.TrimPrefix(lines[1], "└── *"))[0]) {
		t.Fatalf("root line %q (root %s)", lines[1], root)
	}
	for i, k := range kids {
		f := strings.Fields(lines[2+i])
		if !strings.HasPrefix(lines[2+i], "    ") || len(f) < 3 || !strings.HasSuffix(k, f[1]) || f[2] != "draft" {
			t.Fatalf("child line %q (child %s)\n%s", lines[2+i], k, r.stdout)
		}
	}
	dot := d.mustCtl(nil, "tree", g.Group.GroupID, "--dot").stdout
	if !strings.HasPrefix(dot, "digraph ") || strings.Count(dot, " -> ") != 3 || !strings.Contains(dot, `"`+root+`" -> "`+kids[0]+`"`) {
		t.Fatalf("tree --dot:\n%s", dot)
	}
	var tree struct {
		Group struct {
			GroupID string `json:"group_id"`
		} `json:"group"`
		Nodes   []nodeJSON         `json:"nodes"`
		Rewards map[string]float64 `json:"rewards"`
	}
	decode(t, d.mustCtl(nil, "-o", "json", "tree", g.Group.GroupID), &tree)
	if tree.Group.GroupID != g.Group.GroupID || len(tree.Nodes) != 4 || tree.Nodes[0].NodeID != root || tree.Rewards == nil {
		t.Fatalf("tree -o json: %+v", tree)
	}

	// inspect -o json: the node and what is around it.
	kid, all := inspectNode(t, d, kids[0])
	for _, k := range []string{"node_id", "group_id", "parents", "root_id", "status", "provenance", "visits", "value",
		"ancestry", "children", "attempts", "leases", "evaluations", "logical_state"} {
		if _, ok := all[k]; !ok {
			t.Errorf("inspect -o json lacks node.%s", k)
		}
	}
	if kid.Status != "draft" || kid.Parents[0] != root || compact(all["ancestry"]) != `["`+root+`"]` || compact(kid.LogicalState) != `{"step":1}` {
		t.Fatalf("inspect of a child: %+v %s", kid, all["ancestry"])
	}
	if r := d.mustCtl(nil, "inspect", kids[0]); !strings.Contains(r.stdout, "ancestry") || !strings.Contains(r.stdout, root) {
		t.Fatalf("inspect (human):\n%s", r.stdout)
	}

	// promote: a stale generation is exit 5; the current one advances it.
	r = d.ctl(nil, "promote", g.Group.GroupID, root, "--expected-generation", "3", "-o", "json")
	if r.code != 5 {
		t.Fatalf("stale promote: exit %d, want 5 (%s)", r.code, r.stderr)
	}
	jsonErr(t, r, "stale_generation")
	r = d.mustCtl(nil, "promote", g.Group.GroupID, root, "--expected-generation", "1")
	if !strings.Contains(r.stdout, "generation 2") {
		t.Fatalf("promote: %s", r.stdout)
	}

	// evaluate with evidence and backprop: the node and every ancestor get
	// a visit. A sealed grandchild needs an attempt; evaluate the root and
	// check the evidence and the statistics.
	ev := filepath.Join(filepath.Dir(d.state), "evidence.log")
	if err := os.WriteFile(ev, []byte("3 passed, 0 failed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := objects(t, d)
	var e struct {
		EvaluationID string   `json:"evaluation_id"`
		NodeID       string   `json:"node_id"`
		Evidence     []string `json:"evidence"`
		Backprop     bool     `json:"backprop"`
	}
	decode(t, d.mustCtl(nil, "-o", "json", "evaluate", root, "--evaluator", "pytest@8.1", "--reward", "0.5",
		"--verdict", "pass", "--evidence", ev, "--backprop"), &e)
	if e.NodeID != root || len(e.Evidence) != 1 || !e.Backprop || len(e.Evidence[0]) != 64 {
		t.Fatalf("evaluate: %+v", e)
	}
	if after := objects(t, d); after != before+1 {
		t.Fatalf("evidence stored %v objects, want 1", after-before)
	}
	n, _ := inspectNode(t, d, root)
	if n.Visits != 1 || n.Value != 0.5 {
		t.Fatalf("after backprop: visits %d value %v", n.Visits, n.Value)
	}
	if r := d.mustCtl(nil, "tree", g.Group.GroupID); !strings.Contains(r.stdout, "reward=0.5") || !strings.Contains(r.stdout, "visits=1 value=0.5") {
		t.Fatalf("tree after evaluate:\n%s", r.stdout)
	}

	// prune a draft.
	if r := d.mustCtl(nil, "prune", kids[2]); strings.TrimSpace(r.stdout) != kids[2] {
		t.Fatalf("prune printed %q", r.stdout)
	}
	if n, _ := inspectNode(t, d, kids[2]); n.Status != "pruned" {
		t.Fatalf("pruned node is %s", n.Status)
	}

	// Bad input: each its code and exit status.
	unknownNode := "node_0000000000000000000000000z"
	for _, tt := range []struct {
		name string
		args []string
		exit int
		code string
	}{
		{"unknown id", []string{"inspect", unknownNode}, 3, "not_found"},
		{"fork unknown", []string{"fork", unknownNode}, 3, "not_found"},
		{"fork a draft", []string{"fork", kids[0]}, 6, "failed_precondition"},
		{"malformed logical state", []string{"fork", root, "--logical-state", `{"step":`}, 2, "invalid_argument"},
		{"malformed policy", []string{"group", "create", "--from", src, "--policy", "{"}, 2, "invalid_argument"},
		{"malformed id", []string{"inspect", "bogus"}, 2, "invalid_argument"},
		{"missing flag", []string{"promote", g.Group.GroupID, root}, 2, "invalid_argument"},
		{"bad evaluator", []string{"evaluate", root, "--evaluator", "noversion", "--reward", "1", "--verdict", "x"}, 2, "invalid_argument"},
		{"missing evidence", []string{"evaluate", root, "--evaluator", "e@1", "--reward", "1", "--verdict", "x", "--evidence", "/nonexistent"}, 3, "not_found"},
		{"prune the canonical node", []string{"prune", root}, 6, "failed_precondition"},
		{"group from a missing dir", []string{"group", "create", "--from", filepath.Join(src, "absent")}, 3, "not_found"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := d.ctl(nil, append(tt.args, "-o", "json")...)
			if r.code != tt.exit {
				t.Errorf("exit %d, want %d (%s)", r.code, tt.exit, r.stderr)
			}
			jsonErr(t, r, tt.code)
			if r.stdout != "" {
				t.Errorf("stdout on error: %q", r.stdout)
			}
		})
	}
}

// TestIdempotencyKeys: the same --idempotency-key twice returns the same
// JSON and does the work once; another request under it is a conflict.
func TestIdempotencyKeys(t *testing.T) {
	d := startDaemon(t)
	g := createGroup(t, d, smallTree(t, d, map[string]string{"f": "x"}), "--idempotency-key", "create-1")
	again := d.mustCtl(nil, "-o", "json", "group", "create", "--from", g.Node.RootID, "--idempotency-key", "create-2")
	replay := d.mustCtl(nil, "-o", "json", "group", "create", "--from", g.Node.RootID, "--idempotency-key", "create-2")
	if again.stdout != replay.stdout {
		t.Fatalf("group create replay differs:\n%s\n%s", again.stdout, replay.stdout)
	}

	first := d.mustCtl(nil, "fork", g.Node.NodeID, "-n", "2", "-o", "json", "--idempotency-key", "fork-abc")
	second := d.mustCtl(nil, "fork", g.Node.NodeID, "-n", "2", "-o", "json", "--idempotency-key", "fork-abc")
	if first.stdout != second.stdout {
		t.Fatalf("fork replay differs:\n%s\n%s", first.stdout, second.stdout)
	}
	r := d.ctl(nil, "fork", g.Node.NodeID, "-n", "3", "-o", "json", "--idempotency-key", "fork-abc")
	if r.code != 4 {
		t.Fatalf("other request under the key: exit %d, want 4 (%s)", r.code, r.stderr)
	}
	jsonErr(t, r, "conflict")
	var tree struct {
		Nodes []nodeJSON `json:"nodes"`
	}
	decode(t, d.mustCtl(nil, "-o", "json", "tree", g.Group.GroupID), &tree)
	if len(tree.Nodes) != 3 {
		t.Fatalf("%d nodes after a fork of 2 and its replay, want 3", len(tree.Nodes))
	}

	// evaluate --backprop replayed: one visit.
	for range 3 {
		d.mustCtl(nil, "evaluate", g.Node.NodeID, "--evaluator", "e@1", "--reward", "2", "--verdict", "ok", "--backprop", "--idempotency-key", "eval-1")
	}
	if n, _ := inspectNode(t, d, g.Node.NodeID); n.Visits != 1 || n.Value != 2 {
		t.Fatalf("three replays of one backprop: visits %d value %v", n.Visits, n.Value)
	}
}

// TestEventsFollow: esfctl events --follow prints, as JSON lines, events
// another esfctl causes, and exits 0 when interrupted.
func TestEventsFollow(t *testing.T) {
	d := startDaemon(t)
	g := createGroup(t, d, smallTree(t, d, map[string]string{"f": "x"}))

	// Listing: every event so far, as JSON lines; --group filters.
	r := d.mustCtl(nil, "events", "--group", g.Group.GroupID)
	var last struct {
		Seq  uint64 `json:"seq"`
		Type string `json:"type"`
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("events of a new group:\n%s", r.stdout)
	}
	if err := json.Unmarshal([]byte(lines[1]), &last); err != nil || last.Type != "node.created" {
		t.Fatalf("last event %q: %v", lines[1], err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, esfctlBin, "events", "--follow", "--group", g.Group.GroupID, "--after", jsonNumber(last.Seq))
	cmd.Env = append(os.Environ(), "ESF_SOCKET="+d.socket)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 16)
	go func() {
		defer close(got)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			got <- sc.Text()
		}
	}()
	// The follower may not be connected yet when the fork commits; it
	// starts after last.Seq, so it gets the fork either way.
	kids := fork(t, d, g.Node.NodeID, 1)
	select {
	case line, ok := <-got:
		var ev struct {
			Seq    uint64 `json:"seq"`
			Type   string `json:"type"`
			NodeID string `json:"node_id"`
		}
		if !ok || json.Unmarshal([]byte(line), &ev) != nil || ev.Type != "node.forked" || ev.NodeID != kids[0] || ev.Seq != last.Seq+1 {
			t.Fatalf("followed %q (open %v), want the fork of %s", line, ok, kids[0])
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no event from the follower in 15s; stderr %s", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for range got {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("events --follow after SIGINT: %v (%s)", err, stderr.String())
	}
}
