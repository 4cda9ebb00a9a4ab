package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/fabric"
)

// TestPauseResumeForkSnapshot: pause seals (state paused, 409 twice,
// memory refused), connect resumes with the files; fork gives count
// sandboxes that share no writable delta; a snapshot is a template;
// deleting it prunes its node once nothing uses it; the graph holds it
// all.
func TestPauseResumeForkSnapshot(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, map[string]any{"metadata": map[string]string{"k": "v"}})
	c := h.envd(sb)
	c.sh(t, "echo kept > /home/user/f")

	var e apiError
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"memory": true}, &e); st != 400 {
		t.Fatalf("memory pause: %d %+v", st, e)
	}
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", nil, nil); st != 204 {
		t.Fatalf("pause: %d", st)
	}
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", nil, &e); st != 409 || e.Code != 409 {
		t.Fatalf("pause twice: %d %+v", st, e)
	}
	var d sandboxDetail
	if h.call(t, "GET", "/sandboxes/"+sb.SandboxID, nil, &d); d.State != "paused" {
		t.Fatalf("state after pause: %+v", d)
	}
	var list []sandboxDetail
	if h.call(t, "GET", "/v2/sandboxes?state=paused", nil, &list); len(list) != 1 || list[0].SandboxID != sb.SandboxID {
		t.Fatalf("list paused: %+v", list)
	}
	if h.call(t, "GET", "/v2/sandboxes", nil, &list); len(list) != 1 || list[0].State != "paused" {
		t.Fatalf("list v2, every state: %+v", list)
	}
	if h.call(t, "GET", "/sandboxes", nil, &list); len(list) != 0 {
		t.Fatalf("list v1, running only: %+v", list)
	}
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 300, "memory": true}, nil); st != 400 {
		t.Fatalf("connect with memory: %d", st)
	}
	var rep sandboxReply
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 300}, &rep); st != 201 || rep.SandboxID != sb.SandboxID {
		t.Fatalf("resume: %d %+v", st, rep)
	}
	c = h.envd(rep)
	if out := c.sh(t, "cat /home/user/f"); out != "kept\n" {
		t.Fatalf("after resume: %q", out)
	}

	// Fork into 3: each child writes its own file and sees only its own.
	var kids []forkChild
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/fork", map[string]any{"count": 3, "timeout": 300}, &kids); st != 201 || len(kids) != 3 {
		t.Fatalf("fork: %d %+v", st, kids)
	}
	for i, k := range kids {
		if k.Sandbox == nil {
			t.Fatalf("child %d: %+v", i, k.Error)
		}
		h.envd(*k.Sandbox).sh(t, fmt.Sprintf("echo %d > /home/user/child%d", i, i))
	}
	for i, k := range kids {
		want := fmt.Sprintf("kept\nchild%d\n", i)
		if out := h.envd(*k.Sandbox).sh(t, "cat f; ls /home/user | grep child"); out != want {
			t.Fatalf("child %d sees %q, want %q", i, out, want)
		}
	}
	if out := c.sh(t, "ls /home/user"); out != "f\n" {
		t.Fatalf("the parent sees %q", out)
	}

	// A snapshot is a template.
	c.sh(t, "echo snap > /home/user/s")
	var snap snapshotInfo
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", map[string]any{"name": "mine"}, &snap); st != 201 || snap.SnapshotID == "" || snap.Names[0] != "mine" {
		t.Fatalf("snapshot: %d %+v", st, snap)
	}
	c.sh(t, "rm /home/user/s")
	var snaps []snapshotInfo
	if h.call(t, "GET", "/snapshots?sandboxID="+sb.SandboxID, nil, &snaps); len(snaps) != 1 || snaps[0].SnapshotID != snap.SnapshotID {
		t.Fatalf("list snapshots: %+v", snaps)
	}
	from := h.create(t, map[string]any{"templateID": snap.SnapshotID})
	if out := h.envd(from).sh(t, "cat /home/user/s"); out != "snap\n" {
		t.Fatalf("from the snapshot: %q", out)
	}
	if st, _ := h.call(t, "DELETE", "/templates/"+snap.SnapshotID, nil, nil); st != 409 {
		t.Fatalf("delete a snapshot in use: %d", st)
	}
	h.call(t, "DELETE", "/sandboxes/"+from.SandboxID, nil, nil)
	if st, _ := h.call(t, "DELETE", "/templates/"+snap.SnapshotID, nil, nil); st != 204 {
		t.Fatalf("delete snapshot: %d", st)
	}
	if st, _ := h.call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": snap.SnapshotID, "allow_internet_access": false}, nil); st != 404 {
		t.Fatalf("create from a deleted snapshot: %d", st)
	}

	// The graph holds the session: root, pause, 3 forks, snapshot (and
	// the fork's checkpoint).
	tree, err := h.f.Tree(context.Background(), h.groupID)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tree.Nodes); n < 7 {
		t.Fatalf("tree has %d nodes, want at least 7", n)
	}
}

// TestAutoPause: with autoPause a sandbox whose timeout passes is paused,
// not killed, and resumes with its files.
func TestAutoPause(t *testing.T) {
	h := newHarness(t)
	// The file is written before the timeout is made short: with a
	// timeout of 1 s from the create, a loaded machine can pause the
	// sandbox before the write reaches it.
	sb := h.create(t, map[string]any{"timeout": 300, "autoPause": true})
	h.envd(sb).sh(t, "echo x > /home/user/x")
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", map[string]any{"timeout": 1}, nil); st != 204 {
		t.Fatalf("set timeout: %d", st)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var d sandboxDetail
		st, _ := h.call(t, "GET", "/sandboxes/"+sb.SandboxID, nil, &d)
		if st != http.StatusOK {
			t.Fatalf("get info: %d", st)
		}
		if d.State == "paused" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not paused 2 minutes after its timeout")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var rep sandboxReply
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 300}, &rep); st != 201 {
		t.Fatalf("resume: %d", st)
	}
	if out := h.envd(rep).sh(t, "cat /home/user/x"); out != "x\n" {
		t.Fatalf("after auto-pause: %q", out)
	}
}

// TestMetadataInProvenance: a create's metadata and the names (never the
// values) of its envVars are kept with the attempt, so the provenance of
// the nodes it seals (snapshot, pause) holds them; get info still serves
// the metadata.
func TestMetadataInProvenance(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, map[string]any{"metadata": map[string]string{"run": "r1", "step": "7"},
		"envVars": map[string]string{"TOKEN": "s3cret", "A": "1"}})
	check := func(what, node string) {
		t.Helper()
		rec, err := h.f.Provenance(context.Background(), node, fabric.ExportInfo{Format: "dir"})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Attempt == nil {
			t.Fatalf("%s: no attempt in the provenance: %+v", what, rec)
		}
		want := map[string]string{LabelSandboxID: sb.SandboxID, LabelTemplate: h.groupID,
			"metadata.run": "r1", "metadata.step": "7", LabelEnvKeys: "A,TOKEN"}
		if !maps.Equal(rec.Attempt.Labels, want) {
			t.Fatalf("%s: labels %v, want %v", what, rec.Attempt.Labels, want)
		}
		// (The seal's origin.environment pins the container's env, values
		// included, as for any runc attempt; the labels hold names only.)
		if b, _ := json.Marshal(rec.Attempt.Labels); strings.Contains(string(b), "s3cret") {
			t.Fatalf("%s: an env value in the labels: %s", what, b)
		}
	}
	var snap snapshotInfo
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", nil, &snap); st != 201 {
		t.Fatalf("snapshot: %d", st)
	}
	check("snapshot", snap.SnapshotID)
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", nil, nil); st != 204 {
		t.Fatalf("pause: %d", st)
	}
	h.srv.mu.Lock()
	paused := h.srv.sandboxes[sb.SandboxID].paused
	h.srv.mu.Unlock()
	check("pause", paused)
	var d sandboxDetail
	if h.call(t, "GET", "/sandboxes/"+sb.SandboxID, nil, &d); d.Metadata["run"] != "r1" || d.Metadata["step"] != "7" {
		t.Fatalf("get info: %+v", d)
	}
}

// TestIdempotencyKey: with an Idempotency-Key header a retried create,
// snapshot, fork or pause answers as the first call did (the same
// sandbox, not a second one) and a different request under the key is
// 409; the fabric calls carry keys derived from it. Without the header
// every call is new and the fabric makes up its keys.
func TestIdempotencyKey(t *testing.T) {
	h := newHarness(t)
	idem := func(key, method, path string, body, out any) int {
		t.Helper()
		st, hdr := h.callHdr(t, testKey, map[string]string{HeaderIdempotencyKey: key}, method, path, body, out)
		if st < 300 && hdr.Get(HeaderIdempotencyKey) != key {
			t.Fatalf("%s %s: answered key %q", method, path, hdr.Get(HeaderIdempotencyKey))
		}
		return st
	}
	body := map[string]any{"templateID": h.groupID, "timeout": 300, "allow_internet_access": false}
	var a, b sandboxReply
	if st := idem("create-1", "POST", "/v2/sandboxes", body, &a); st != 201 {
		t.Fatalf("create: %d", st)
	}
	if st := idem("create-1", "POST", "/v2/sandboxes", body, &b); st != 201 || b != a {
		t.Fatalf("retried create: %d %+v, first %+v", st, b, a)
	}
	var e apiError
	other := map[string]any{"templateID": h.groupID, "timeout": 60, "allow_internet_access": false}
	if st := idem("create-1", "POST", "/v2/sandboxes", other, &e); st != 409 || e.Code != 409 {
		t.Fatalf("another body under the key: %d %+v", st, e)
	}
	var list []sandboxDetail
	if h.call(t, "GET", "/v2/sandboxes", nil, &list); len(list) != 1 {
		t.Fatalf("after a retried create: %d sandboxes, want 1", len(list))
	}
	if c := h.create(t, nil); c.SandboxID == a.SandboxID {
		t.Fatal("a create without a key gave the keyed sandbox")
	}

	origin := func(node string) string {
		t.Helper()
		in, err := h.f.Inspect(context.Background(), node)
		if err != nil {
			t.Fatal(err)
		}
		return in.Node.Provenance.IdempotencyKey
	}
	path := "/sandboxes/" + a.SandboxID
	var s1, s2, s3 snapshotInfo
	if st := idem("snap-1", "POST", path+"/snapshots", map[string]any{}, &s1); st != 201 {
		t.Fatalf("snapshot: %d", st)
	}
	if st := idem("snap-1", "POST", path+"/snapshots", map[string]any{}, &s2); st != 201 || s2.SnapshotID != s1.SnapshotID {
		t.Fatalf("retried snapshot: %d %+v, first %+v", st, s2, s1)
	}
	if k := origin(s1.SnapshotID); k != "e2b-snap-1-snapshot" {
		t.Fatalf("the snapshot's fabric key: %q", k)
	}
	if st, _ := h.call(t, "POST", path+"/snapshots", map[string]any{}, &s3); st != 201 || s3.SnapshotID == s1.SnapshotID {
		t.Fatalf("snapshot without a key: %d %+v", st, s3)
	}
	if k := origin(s3.SnapshotID); !strings.HasPrefix(k, "gen-") {
		t.Fatalf("a snapshot without a key got fabric key %q", k)
	}

	var k1, k2 []forkChild
	if st := idem("fork-1", "POST", path+"/fork", map[string]any{"count": 2, "timeout": 300}, &k1); st != 201 || len(k1) != 2 {
		t.Fatalf("fork: %d %+v", st, k1)
	}
	if st := idem("fork-1", "POST", path+"/fork", map[string]any{"count": 2, "timeout": 300}, &k2); st != 201 || len(k2) != 2 {
		t.Fatalf("retried fork: %d %+v", st, k2)
	}
	for i := range k1 {
		if k1[i].Sandbox == nil || k2[i].Sandbox == nil || *k1[i].Sandbox != *k2[i].Sandbox {
			t.Fatalf("fork child %d: %+v then %+v", i, k1[i], k2[i])
		}
	}
	if h.call(t, "GET", "/v2/sandboxes", nil, &list); len(list) != 4 {
		t.Fatalf("after a retried fork: %d sandboxes, want 4", len(list))
	}

	if st := idem("pause-1", "POST", path+"/pause", nil, nil); st != 204 {
		t.Fatalf("pause: %d", st)
	}
	if st := idem("pause-1", "POST", path+"/pause", nil, nil); st != 204 {
		t.Fatalf("retried pause: %d", st)
	}
	if st, _ := h.call(t, "POST", path+"/pause", nil, &e); st != 409 {
		t.Fatalf("pause again without a key: %d", st)
	}
	if st := idem("bad\tkey", "POST", path+"/pause", nil, &e); st != 400 {
		t.Fatalf("a malformed key: %d", st)
	}
}

// TestIdempotentCreateFailedAfterActivation: a keyed create whose
// activation succeeded but whose sandbox could not be made usable (here
// the template's /home is a file, so /home/user cannot be made) releases
// its attempt (it used to leave it live: the release carried the
// activation's key and the fabric refused it), and a retry under the key
// does not answer that attempt as a live sandbox.
func TestIdempotentCreateFailedAfterActivation(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	rootfs := t.TempDir()
	if err := runctest.Busybox(rootfs); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(rootfs, "home"))
	if err := os.WriteFile(filepath.Join(rootfs, "home"), []byte("not a directory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	imp, err := h.f.Import(ctx, fabric.ImportSource{Path: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	g, err := h.f.CreateGroup(ctx, fabric.CreateGroupRequest{RootID: imp.Root.String()})
	if err != nil {
		t.Fatal(err)
	}
	body := map[string]any{"templateID": g.Group.GroupID, "timeout": 300}
	hdr := map[string]string{HeaderIdempotencyKey: "create-broken"}
	for i := range 2 {
		var e apiError
		st, _ := h.callHdr(t, testKey, hdr, "POST", "/v2/sandboxes", body, &e)
		if st == http.StatusCreated || (i == 1 && st != http.StatusConflict) {
			t.Fatalf("call %d: a create that could not make %s answered %d %+v", i, Home, st, e)
		}
		// The attempt it activated is not left behind.
		in, err := h.f.Inspect(ctx, g.Node.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		if len(in.Node.Leases) != 0 {
			t.Fatalf("call %d: the failed create left live attempts: %+v", i, in.Node.Leases)
		}
	}
	var list []sandboxDetail
	if h.call(t, "GET", "/v2/sandboxes", nil, &list); len(list) != 0 {
		t.Fatalf("sandboxes after a failed create: %+v", list)
	}
}

// TestIdempotentCreateAfterItsSandboxEnded: a keyed create's sandbox was
// killed (its attempt released), then the front door restarted and forgot
// the key's answer. A retry under the key makes the fabric replay the
// first activation, whose recorded answer says "active": the front door
// must not serve that released attempt as a live sandbox.
func TestIdempotentCreateAfterItsSandboxEnded(t *testing.T) {
	h := newHarness(t)
	body := map[string]any{"templateID": h.groupID, "timeout": 300}
	hdr := map[string]string{HeaderIdempotencyKey: "create-then-kill"}
	var first sandboxReply
	if st, _ := h.callHdr(t, testKey, hdr, "POST", "/v2/sandboxes", body, &first); st != http.StatusCreated {
		t.Fatalf("create: %d", st)
	}
	if st, _ := h.call(t, "DELETE", "/sandboxes/"+first.SandboxID, nil, nil); st != http.StatusNoContent {
		t.Fatalf("kill: %d", st)
	}
	h.restartFront(t)
	var rep sandboxReply
	var e apiError
	st, _ := h.callHdr(t, testKey, hdr, "POST", "/v2/sandboxes", body, &rep)
	if st == http.StatusCreated {
		t.Fatalf("a retry after the sandbox ended answered 201 %+v", rep)
	}
	h.callHdr(t, testKey, hdr, "POST", "/v2/sandboxes", body, &e)
	if st != http.StatusConflict || !strings.Contains(e.Message, "ended") {
		t.Fatalf("a retry after the sandbox ended: %d %+v, want 409 saying it ended", st, e)
	}
	var list []sandboxDetail
	if h.call(t, "GET", "/v2/sandboxes", nil, &list); len(list) != 0 {
		t.Fatalf("sandboxes: %+v", list)
	}
}
