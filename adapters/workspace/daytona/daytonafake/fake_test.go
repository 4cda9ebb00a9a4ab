package daytonafake_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/daytona/daytonafake"
)

const key = "k"

type client struct {
	t   *testing.T
	srv *daytonafake.Server
}

func newServer(t *testing.T, opts daytonafake.Options) *client {
	t.Helper()
	opts.APIKey = key
	srv, err := daytonafake.New(opts)
	if err != nil {
		t.Skipf("fake unavailable on this host: %v", err)
	}
	t.Cleanup(srv.Close)
	return &client{t: t, srv: srv}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(a.body, &m); err != nil {
		t.Fatalf("answer %d %q is not a JSON object: %v", a.status, a.body, err)
	}
	return m
}

func (c *client) do(method, u string, body any, hdr ...string) answer {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}

func (c *client) api(method, p string, body any) answer {
	return c.do(method, c.srv.URL()+p, body)
}

func (c *client) tb(id, method, p string, body any, hdr ...string) answer {
	return c.do(method, c.srv.ToolboxURL()+"/"+id+p, body, hdr...)
}

func (c *client) create(body map[string]any) string {
	c.t.Helper()
	a := c.api("POST", "/sandbox", body)
	if a.status != 200 {
		c.t.Fatalf("create: %d %s", a.status, a.body)
	}
	id := a.json(c.t)["id"].(string)
	c.waitState(id, "started")
	return id
}

func (c *client) waitState(id, want string) {
	c.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if sb, _ := c.srv.Inspect(id); sb.State == want {
			return
		}
		if time.Now().After(deadline) {
			sb, _ := c.srv.Inspect(id)
			c.t.Fatalf("sandbox %s stuck in %q, want %q", id, sb.State, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantStatus(t *testing.T, what string, a answer, status int) {
	t.Helper()
	if a.status != status {
		t.Errorf("%s: HTTP %d %s, want %d", what, a.status, a.body, status)
	}
}

// TestAPIErrorShapes: NestJS bodies on the API, common-go bodies on the
// toolbox gate, bare statuses from the daemon's file handlers.
func TestAPIErrorShapes(t *testing.T) {
	c := newServer(t, daytonafake.Options{})
	a := c.api("GET", "/sandbox/nope", nil)
	wantStatus(t, "get unknown", a, 404)
	m := a.json(t)
	if m["statusCode"] != float64(404) || m["error"] != "Not Found" || m["message"] != "Sandbox with ID or name nope not found" || m["path"] != "/api/sandbox/nope" || m["timestamp"] == nil {
		t.Errorf("404 body %v", m)
	}
	a = c.do("GET", c.srv.URL()+"/sandbox", nil, "Authorization", "Bearer wrong")
	wantStatus(t, "bad key", a, 401)
	if a.json(t)["message"] != "Unauthorized" {
		t.Errorf("401 body %s", a.body)
	}
	a = c.tb("nope", "GET", "/files?path=/tmp", nil)
	wantStatus(t, "toolbox of unknown sandbox", a, 401)
	if m := a.json(t); m["code"] != "UNAUTHORIZED" || m["method"] != "GET" {
		t.Errorf("toolbox 401 body %v", m)
	}
	id := c.create(nil)
	a = c.tb(id, "GET", "/files/info?path=/home/daytona/missing", nil)
	wantStatus(t, "info of a missing file", a, 404)
	if len(a.body) != 0 {
		t.Errorf("daemon file errors have no body, got %q", a.body)
	}
	a = c.api("POST", "/sandbox", map[string]any{"name": "dup"})
	c.waitState(a.json(t)["id"].(string), "started")
	wantStatus(t, "duplicate name", c.api("POST", "/sandbox", map[string]any{"name": "dup"}), 409)
}

// TestLifecycleStates: Daytona's asynchronous states and guards.
func TestLifecycleStates(t *testing.T) {
	c := newServer(t, daytonafake.Options{Transition: 50 * time.Millisecond})
	a := c.api("POST", "/sandbox", map[string]any{"labels": map[string]string{"a": "b"}})
	m := a.json(t)
	id := m["id"].(string)
	if m["state"] != "creating" || m["desiredState"] != "started" || m["toolboxProxyUrl"] != c.srv.ToolboxURL() {
		t.Errorf("create answered %v", m)
	}
	wantStatus(t, "delete while creating", c.api("DELETE", "/sandbox/"+id, nil), 409)
	wantStatus(t, "toolbox while creating", c.tb(id, "GET", "/user-home-dir", nil), 400)
	c.waitState(id, "started")
	if a := c.tb(id, "GET", "/user-home-dir", nil); a.status != 200 || a.json(t)["dir"] != "/home/daytona" {
		t.Errorf("home: %d %s", a.status, a.body)
	}
	wantStatus(t, "start a started sandbox (no-op)", c.api("POST", "/sandbox/"+id+"/start", nil), 200)
	wantStatus(t, "pause a container", c.api("POST", "/sandbox/"+id+"/pause", nil), 422)

	m = c.api("POST", "/sandbox/"+id+"/stop", nil).json(t)
	if m["state"] != "started" || m["desiredState"] != "stopped" {
		t.Errorf("stop answered state %v desired %v", m["state"], m["desiredState"])
	}
	wantStatus(t, "stop while stopping", c.api("POST", "/sandbox/"+id+"/stop", nil), 409)
	c.waitState(id, "stopped")
	a = c.tb(id, "GET", "/files?path=/tmp", nil)
	wantStatus(t, "toolbox of a stopped sandbox", a, 400)
	if m := a.json(t); m["message"] != "no IP address found. Is the Sandbox started?" {
		t.Errorf("stopped toolbox body %v", m)
	}
	wantStatus(t, "stop a stopped sandbox", c.api("POST", "/sandbox/"+id+"/stop", nil), 400)
	wantStatus(t, "start", c.api("POST", "/sandbox/"+id+"/start", nil), 200)
	c.waitState(id, "started")

	if n := c.srv.Live(); n != 1 {
		t.Errorf("Live = %d", n)
	}
	list := c.api("GET", "/sandbox?labels="+url.QueryEscape(`{"a":"b"}`), nil).json(t)
	if items := list["items"].([]any); len(items) != 1 || list["nextCursor"] != nil {
		t.Errorf("list = %v", list)
	}
	m = c.api("DELETE", "/sandbox/"+id, nil).json(t)
	if m["desiredState"] != "destroyed" {
		t.Errorf("delete answered %v", m)
	}
	if n := c.srv.Live(); n != 0 {
		t.Errorf("Live after delete = %d", n)
	}
	wantStatus(t, "delete while destroying", c.api("DELETE", "/sandbox/"+id, nil), 409)
	if a := c.tb(id, "GET", "/files?path=/tmp", nil); a.status != 404 && a.status != 401 {
		t.Errorf("toolbox of a destroyed sandbox: %d", a.status)
	}
	for deadline := time.Now().Add(5 * time.Second); c.api("GET", "/sandbox/"+id, nil).status != 404; {
		if time.Now().After(deadline) {
			t.Fatal("destroyed sandbox still readable")
		}
		time.Sleep(10 * time.Millisecond)
	}

	vm := newServer(t, daytonafake.Options{SandboxClass: "linux-vm"})
	id = vm.create(nil)
	wantStatus(t, "pause a VM", vm.api("POST", "/sandbox/"+id+"/pause", nil), 200)
	vm.waitState(id, "paused")
	wantStatus(t, "resume a VM", vm.api("POST", "/sandbox/"+id+"/start", nil), 200)
	vm.waitState(id, "started")
}

// TestSessionLogs: the daemon's labelled log and its three renderings, the
// newline it adds to a last partial line, the NUL bytes it drops, and an
// exit code that appears only with the complete log.
func TestSessionLogs(t *testing.T) {
	c := newServer(t, daytonafake.Options{})
	id := c.create(nil)
	wantStatus(t, "create session", c.tb(id, "POST", "/process/session", map[string]string{"sessionId": "s"}), 201)
	wantStatus(t, "create it again", c.tb(id, "POST", "/process/session", map[string]string{"sessionId": "s"}), 409)
	a := c.tb(id, "POST", "/process/session/s/exec", map[string]any{"command": `echo out; printf 'e\000rr' >&2; printf tail`, "runAsync": true})
	wantStatus(t, "exec", a, 202)
	cmd := a.json(t)["cmdId"].(string)
	for deadline := time.Now().Add(5 * time.Second); ; {
		m := c.tb(id, "GET", "/process/session/s/command/"+cmd, nil).json(t)
		if m["exitCode"] != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("command never finished")
		}
		time.Sleep(5 * time.Millisecond)
	}
	raw := c.tb(id, "GET", "/process/session/s/command/"+cmd+"/logs", nil, "X-Daytona-Split-Output", "true").body
	lines := map[string]bool{}
	for _, l := range strings.SplitAfter(string(raw), "\n") {
		lines[l] = true
	}
	for _, want := range []string{"\x01\x01\x01out\n", "\x02\x02\x02err\n", "\x01\x01\x01tail\n"} {
		if !lines[want] {
			t.Errorf("raw log %q lacks record %q", raw, want)
		}
	}
	combined := string(c.tb(id, "GET", "/process/session/s/command/"+cmd+"/logs", nil).body)
	if strings.ContainsAny(combined, "\x01\x02") || len(combined) != len("out\nerr\ntail\n") {
		t.Errorf("combined log %q", combined)
	}
	j := c.tb(id, "GET", "/process/session/s/command/"+cmd+"/logs", nil, "X-Daytona-SDK-Version", "0.205.1").json(t)
	if j["stdout"] != "out\ntail\n" || j["stderr"] != "err\n" {
		t.Errorf("JSON log %v", j)
	}
	a = c.tb(id, "POST", "/process/session/s/exec", map[string]any{"command": "sleep 60", "async": true})
	if c.srv.Processes() != 1 {
		t.Errorf("Processes = %d with one sleep running", c.srv.Processes())
	}
	wantStatus(t, "delete session", c.tb(id, "DELETE", "/process/session/s", nil), 204)
	if n, m := c.srv.Processes(), c.srv.ToolboxSessions(); n != 0 || m != 0 {
		t.Errorf("after deleting the session: %d processes, %d sessions", n, m)
	}
	wantStatus(t, "exec in a deleted session", c.tb(id, "POST", "/process/session/s/exec", map[string]any{"command": "true"}), 500)
}

// TestExecute: one combined result; 408 when the timeout kills it.
func TestExecute(t *testing.T) {
	c := newServer(t, daytonafake.Options{})
	id := c.create(map[string]any{"env": map[string]string{"SB": "sandbox"}})
	m := c.tb(id, "POST", "/process/execute", map[string]any{"command": `echo "$SB $X"; echo err >&2; exit 4`, "envs": map[string]string{"X": "x"}}).json(t)
	if m["result"] != "sandbox x\nerr\n" || m["exitCode"] != float64(4) {
		t.Errorf("execute = %v", m)
	}
	a := c.tb(id, "POST", "/process/execute", map[string]any{"command": "sleep 30", "timeout": 1})
	wantStatus(t, "execute past its timeout", a, 408)
	wantStatus(t, "empty command", c.tb(id, "POST", "/process/execute", map[string]any{"command": " "}), 400)
}

// TestFilesAndIsolation: every sandbox has its own /tmp and /home, the
// same for the file API and for commands; move refuses to overwrite.
func TestFilesAndIsolation(t *testing.T) {
	c := newServer(t, daytonafake.Options{})
	a, b := c.create(nil), c.create(nil)
	m := c.tb(a, "POST", "/process/execute", map[string]any{"command": "echo a > /tmp/f && echo a > ~/g"}).json(t)
	if m["exitCode"] != float64(0) {
		t.Fatalf("execute: %v", m)
	}
	if got := c.tb(a, "GET", "/files/download?path=/tmp/f", nil); got.status != 200 || string(got.body) != "a\n" {
		t.Errorf("download of a's /tmp/f: %d %q", got.status, got.body)
	}
	wantStatus(t, "b's /tmp/f", c.tb(b, "GET", "/files/info?path=/tmp/f", nil), 404)
	wantStatus(t, "download a directory", c.tb(a, "GET", "/files/download?path=/tmp", nil), 400)
	wantStatus(t, "list a file", c.tb(a, "GET", "/files?path=/tmp/f", nil), 400)
	wantStatus(t, "outside the sandbox", c.tb(a, "GET", "/files/info?path=/etc/passwd", nil), 403)
	wantStatus(t, "move onto an existing file", c.tb(a, "POST", "/files/move?source=/tmp/f&destination=/home/daytona/g", nil), 409)
	wantStatus(t, "delete a directory without recursive", c.tb(a, "DELETE", "/files?path=/home/daytona", nil), 400)
	wantStatus(t, "upload raw body", c.tb(a, "POST", "/files/upload-v2?path=/tmp/new/raw", "raw bytes", "Content-Type", "application/octet-stream"), 200)
	if got := c.tb(a, "GET", "/files/download?path=/tmp/new/raw", nil); string(got.body) != "raw bytes" {
		t.Errorf("raw upload read back as %q", got.body)
	}
	list := c.tb(a, "GET", "/files?path=/tmp", nil)
	var infos []map[string]any
	json.Unmarshal(list.body, &infos)
	if len(infos) != 2 || infos[0]["path"] == nil || infos[0]["mode"] == nil || infos[0]["permissions"] == nil {
		t.Errorf("list /tmp = %s", list.body)
	}
}

// TestThrottle: 429 with Retry-After in whole seconds and the throttler's
// message.
func TestThrottle(t *testing.T) {
	c := newServer(t, daytonafake.Options{})
	c.srv.Throttle(1, 1500*time.Millisecond)
	a := c.api("GET", "/sandbox", nil)
	wantStatus(t, "throttled", a, 429)
	if a.header.Get("Retry-After") != "2" || a.json(t)["message"] != "ThrottlerException: Too Many Requests" {
		t.Errorf("429: Retry-After %q, body %s", a.header.Get("Retry-After"), a.body)
	}
	wantStatus(t, "after the throttle", c.api("GET", "/sandbox", nil), 200)
	if c.srv.Throttled() != 1 {
		t.Errorf("Throttled = %d", c.srv.Throttled())
	}
}
