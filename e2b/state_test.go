package e2b

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRestartKeepsSandboxes: the front door's state is in the journal, so
// a new front door on the same graph (an esfd restart) serves the same
// sandboxes: a running one runs on, reachable with the token its SDK
// holds, and a connect answers a new token beside it; a paused one
// resumes with its files and envVars; snapshots are still listed; a
// killed sandbox stays gone.
func TestRestartKeepsSandboxes(t *testing.T) {
	h := newHarness(t)
	run := h.create(t, map[string]any{"metadata": map[string]string{"who": "run"}})
	h.envd(run).sh(t, "echo running > /home/user/r")
	var snap snapshotInfo
	if st, _ := h.call(t, "POST", "/sandboxes/"+run.SandboxID+"/snapshots", map[string]any{"name": "s1"}, &snap); st != 201 {
		t.Fatalf("snapshot: %d", st)
	}
	paused := h.create(t, map[string]any{"envVars": map[string]string{"FOO": "bar"}})
	h.envd(paused).sh(t, "echo paused > /home/user/p")
	if st, _ := h.call(t, "POST", "/sandboxes/"+paused.SandboxID+"/pause", nil, nil); st != 204 {
		t.Fatalf("pause: %d", st)
	}
	gone := h.create(t, nil)
	goneP := h.create(t, nil)
	if st, _ := h.call(t, "POST", "/sandboxes/"+goneP.SandboxID+"/pause", nil, nil); st != 204 {
		t.Fatalf("pause: %d", st)
	}
	for _, id := range []string{gone.SandboxID, goneP.SandboxID} {
		if st, _ := h.call(t, "DELETE", "/sandboxes/"+id, nil, nil); st != 204 {
			t.Fatalf("kill: %d", st)
		}
	}

	h.restartFront(t)

	var list []sandboxDetail
	h.call(t, "GET", "/v2/sandboxes", nil, &list)
	states := map[string]string{}
	for _, d := range list {
		states[d.SandboxID] = d.State
	}
	if len(list) != 2 || states[run.SandboxID] != "running" || states[paused.SandboxID] != "paused" {
		t.Fatalf("after a restart: %+v", list)
	}
	var d sandboxDetail
	if h.call(t, "GET", "/sandboxes/"+run.SandboxID, nil, &d); d.Metadata["who"] != "run" {
		t.Fatalf("metadata after a restart: %+v", d)
	}
	// The SDK's handle from before still works: its token's digest was
	// recorded.
	if out := h.envd(run).sh(t, "cat /home/user/r"); out != "running\n" {
		t.Fatalf("running sandbox after a restart: %q", out)
	}
	bad := h.envd(run)
	bad.token = "wrong"
	if st, _ := bad.unary(t, "/filesystem.Filesystem/Stat", map[string]any{"path": "/home/user/r"}, nil); st != http.StatusUnauthorized {
		t.Fatalf("a wrong token after a restart: %d", st)
	}
	// connect answers a token (a new one: the old is known by its digest
	// only), and both work.
	var rep sandboxReply
	if st, _ := h.call(t, "POST", "/sandboxes/"+run.SandboxID+"/connect", map[string]any{"timeout": 300}, &rep); st != 200 || rep.EnvdAccessToken == "" {
		t.Fatalf("connect to a running sandbox after a restart: %d %+v", st, rep)
	}
	if out := h.envd(rep).sh(t, "cat /home/user/r"); out != "running\n" {
		t.Fatalf("with the new token: %q", out)
	}
	h.envd(run).sh(t, "true")
	var snaps []snapshotInfo
	if h.call(t, "GET", "/snapshots?sandboxID="+run.SandboxID, nil, &snaps); len(snaps) != 1 || snaps[0].SnapshotID != snap.SnapshotID || snaps[0].Names[0] != "s1" {
		t.Fatalf("snapshots after a restart: %+v", snaps)
	}
	// The paused one resumes with its files and envVars.
	if st, _ := h.call(t, "POST", "/sandboxes/"+paused.SandboxID+"/connect", map[string]any{"timeout": 300}, &rep); st != 201 || rep.SandboxID != paused.SandboxID {
		t.Fatalf("resume after a restart: %d %+v", st, rep)
	}
	if out := h.envd(rep).sh(t, "cat /home/user/p; echo $FOO"); out != "paused\nbar\n" {
		t.Fatalf("resumed after a restart: %q", out)
	}
	for _, id := range []string{gone.SandboxID, goneP.SandboxID} {
		if st, _ := h.call(t, "GET", "/sandboxes/"+id, nil, nil); st != 404 {
			t.Fatalf("a killed sandbox after a restart: %d", st)
		}
	}

	// Killed after the restart: gone after the next one; the resumed
	// sandbox runs on.
	if st, _ := h.call(t, "DELETE", "/sandboxes/"+run.SandboxID, nil, nil); st != 204 {
		t.Fatalf("kill: %d", st)
	}
	h.restartFront(t)
	if h.call(t, "GET", "/v2/sandboxes", nil, &list); len(list) != 1 || list[0].SandboxID != paused.SandboxID || list[0].State != "running" {
		t.Fatalf("after a second restart: %+v", list)
	}
	if out := h.envd(rep).sh(t, "cat /home/user/p"); out != "paused\n" {
		t.Fatalf("after a second restart: %q", out)
	}
}

// A call that looked a sandbox up before a kill and records it after
// (info or get minting a token after a restart, a renew) must not bring
// the killed sandbox's record back: a paused sandbox's node stays, so the
// next restart would serve the killed sandbox again.
func TestKilledSandboxStaysGoneAcrossARestartRace(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, nil)
	if st, _ := h.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", nil, nil); st != 204 {
		t.Fatalf("pause: %d", st)
	}
	h.restartFront(t)
	// The info call's lookup, before the kill.
	held, err := h.srv.lookup(context.Background(), sb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := h.call(t, "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil); st != 204 {
		t.Fatalf("kill: %d", st)
	}
	// The info call goes on: it mints a token and records it; a renew
	// records its new end.
	if err := h.srv.ensureToken(context.Background(), held); err != nil {
		t.Logf("ensureToken after the kill: %v", err)
	}
	h.srv.persistLogged(context.Background(), held)
	// A connect that looked it up before the kill and got its turn after
	// it does not resume it.
	held.op.Lock()
	_, _, err = h.srv.resume(context.Background(), held, time.Minute)
	held.op.Unlock()
	if err == nil {
		t.Errorf("a killed sandbox resumed")
	}
	if st, _ := h.call(t, "GET", "/sandboxes/"+sb.SandboxID, nil, nil); st != http.StatusNotFound {
		t.Fatalf("a killed sandbox: %d, want 404", st)
	}

	h.restartFront(t)
	if st, _ := h.call(t, "GET", "/sandboxes/"+sb.SandboxID, nil, nil); st != http.StatusNotFound {
		t.Fatalf("a killed sandbox after a restart: %d, want 404", st)
	}
}

// envVars (or metadata) too big for the sandbox's record are refused
// before any container starts for them.
func TestHugeEnvVarsRefusedUpFront(t *testing.T) {
	h := newHarness(t)
	env := map[string]string{}
	for i := range 30 {
		env["V"+strconv.Itoa(i)] = strings.Repeat("v", 10000)
	}
	var out map[string]any
	st, _ := h.call(t, "POST", "/sandboxes", map[string]any{"templateID": testGroupName, "envVars": env}, &out)
	if msg, _ := out["message"].(string); st != 400 || !strings.Contains(msg, "envVars") {
		t.Fatalf("300 KB of envVars: %d %v", st, out)
	}
	if st, _ := h.call(t, "POST", "/sandboxes", map[string]any{"templateID": testGroupName,
		"envVars": map[string]string{"K": strings.Repeat("v", 100000)}}, nil); st != 201 {
		t.Fatalf("100 KB of envVars: %d", st)
	}
}
