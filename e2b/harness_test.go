package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/e2b/envdwire"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/testenv"
)

// testGroupName names the harness's group.
const testGroupName = "e2b-test-base"

const testKey = "e2b_0123456789abcdef0123456789abcdef"

// harness is a front door on a fabric with a real runc executor, served
// over HTTP, and a group whose root is a busybox rootfs.
type harness struct {
	f       *fabric.Fabric
	srv     *Server
	opts    Options
	cur     atomic.Pointer[Server] // what the HTTP server serves: srv
	url     string
	keys    string // the key file
	groupID string
	nodeID  string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	testenv.Require(t, "fuse", "overlay")
	testenv.Require(t, runctest.Needs...)
	ctx := context.Background()
	dir := t.TempDir()
	initBin, err := runctest.BuildInit(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "esf-e2btest"
	// Containers run in a user namespace, as esfd's do by default.
	userns := runc.IDRange{Start: 1<<30 + 5*65536, Count: 65536}
	idmap, err := delta.NewIDMap(userns.Start, userns.Count)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idmap.Close() })
	ex, err := runc.New(runc.Options{StateDir: filepath.Join(dir, "runc"), Init: initBin, Namespace: ns, UserNS: userns})
	if err != nil {
		t.Fatal(err)
	}
	f, err := fabric.Open(ctx, fabric.Options{StateDir: filepath.Join(dir, "state"), Executor: ex, IDMap: idmap})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{f: f, keys: filepath.Join(dir, "keys")}
	if err := os.WriteFile(h.keys, []byte(testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := api.LoadTokens(h.keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.opts = Options{Keys: keys, Logger: slog.New(slog.DiscardHandler), CPUCount: 1, MemoryMB: 512, RootUID: userns.Start}
	h.srv = New(f, h.opts)
	h.cur.Store(h.srv)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.cur.Load().ServeHTTP(w, r) }))
	h.url = hs.URL
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		h.cur.Load().Close()
		if err := f.StopAll(ctx); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
		if left, _ := ex.List(ctx, ""); len(left) != 0 {
			t.Errorf("containers left: %+v", left)
		}
		runctest.RemoveCgroupParents(ns)
	})
	rootfs := t.TempDir()
	if err := runctest.Busybox(rootfs); err != nil {
		t.Fatal(err)
	}
	imp, err := f.Import(ctx, fabric.ImportSource{Path: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	g, err := f.CreateGroup(ctx, fabric.CreateGroupRequest{RootID: imp.Root.String(), Name: testGroupName})
	if err != nil {
		t.Fatal(err)
	}
	h.groupID, h.nodeID = g.Group.GroupID, g.Node.NodeID
	return h
}

// restartFront replaces the front door by a new one on the same fabric,
// as an esfd restart does (the fabric's attempts stay): what the old one
// kept in memory is gone, and the new one restores what it recorded.
func (h *harness) restartFront(t *testing.T) {
	t.Helper()
	h.srv.Close()
	h.srv = New(h.f, h.opts)
	if err := h.srv.Restore(context.Background()); err != nil {
		t.Fatalf("restore: %v", err)
	}
	h.cur.Store(h.srv)
}

// call makes a control-plane call with the test key and decodes a JSON
// answer into out (if not nil). It returns the status and the response.
func (h *harness) call(t *testing.T, method, path string, body, out any) (int, http.Header) {
	t.Helper()
	return h.callKey(t, testKey, method, path, body, out)
}

func (h *harness) callKey(t *testing.T, key, method, path string, body, out any) (int, http.Header) {
	t.Helper()
	return h.callHdr(t, key, nil, method, path, body, out)
}

// callHdr is callKey with extra request headers.
func (h *harness) callHdr(t *testing.T, key string, hdr map[string]string, method, path string, body, out any) (int, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.url+path, rd)
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode, resp.Header
}

// create makes a sandbox of the group and returns its reply.
func (h *harness) create(t *testing.T, extra map[string]any) sandboxReply {
	t.Helper()
	body := map[string]any{"templateID": h.groupID, "timeout": 300, "allow_internet_access": false}
	for k, v := range extra {
		body[k] = v
	}
	var rep sandboxReply
	if st, _ := h.call(t, "POST", "/v2/sandboxes", body, &rep); st != http.StatusCreated {
		t.Fatalf("create: %d %+v", st, rep)
	}
	return rep
}

// envd calls one sandbox's envd.
type envdClient struct {
	url, id, token string
	user           string
}

func (h *harness) envd(sb sandboxReply) *envdClient {
	return &envdClient{url: h.url, id: sb.SandboxID, token: sb.EnvdAccessToken}
}

func (c *envdClient) header(r *http.Request) {
	r.Header.Set(envdwire.HeaderSandboxID, c.id)
	r.Header.Set(envdwire.HeaderSandboxPort, "49983")
	if c.token != "" {
		r.Header.Set(envdwire.HeaderAccessToken, c.token)
	}
	if c.user != "" {
		r.Header.Set("Authorization", "Basic "+basicAuth(c.user))
	}
}

func basicAuth(u string) string {
	return base64.StdEncoding.EncodeToString([]byte(u + ":"))
}

// unary calls a unary method; it returns the HTTP status and decodes a
// 200 answer into out, or returns the error body's code.
func (c *envdClient) unary(t *testing.T, proc string, req, out any) (int, string) {
	t.Helper()
	b, _ := json.Marshal(req)
	hr, _ := http.NewRequest("POST", c.url+proc, bytes.NewReader(b))
	hr.Header.Set("Content-Type", "application/json")
	c.header(hr)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		var e rpcError
		json.Unmarshal(body, &e)
		return resp.StatusCode, e.Code + ": " + e.Message + string(body)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s: %s: %v", proc, body, err)
		}
	}
	return 200, ""
}

// streamEvent is one message of a process stream, or its end.
type streamEvent struct {
	ev  *envdwire.ProcessEvent
	end *rpcError // set on the end envelope; Code "" means success
	err error     // the stream broke
}

// stream starts a server-streaming call and returns its messages.
func (c *envdClient) stream(ctx context.Context, t *testing.T, proc string, req any, hdr map[string]string) (int, <-chan streamEvent) {
	t.Helper()
	b, _ := json.Marshal(req)
	var env bytes.Buffer
	env.WriteByte(0)
	binary.Write(&env, binary.BigEndian, uint32(len(b)))
	env.Write(b)
	hr, _ := http.NewRequestWithContext(ctx, "POST", c.url+proc, &env)
	hr.Header.Set("Content-Type", "application/connect+json")
	for k, v := range hdr {
		hr.Header.Set(k, v)
	}
	c.header(hr)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan streamEvent, 64)
	if resp.StatusCode != 200 {
		resp.Body.Close()
		close(ch)
		return resp.StatusCode, ch
	}
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		for {
			var h [5]byte
			if _, err := io.ReadFull(br, h[:]); err != nil {
				ch <- streamEvent{err: err}
				return
			}
			p := make([]byte, binary.BigEndian.Uint32(h[1:]))
			if _, err := io.ReadFull(br, p); err != nil {
				ch <- streamEvent{err: err}
				return
			}
			if h[0] == 2 {
				var e struct {
					Error *rpcError `json:"error"`
				}
				json.Unmarshal(p, &e)
				if e.Error == nil {
					e.Error = &rpcError{}
				}
				ch <- streamEvent{end: e.Error}
				return
			}
			var m envdwire.StartResponse
			if err := json.Unmarshal(p, &m); err != nil {
				ch <- streamEvent{err: fmt.Errorf("%s: %w", p, err)}
				return
			}
			ch <- streamEvent{ev: m.Event}
		}
	}()
	return 200, ch
}

// result is what a process stream said, read to its end.
type result struct {
	pid            uint32
	stdout, stderr string
	pty            string
	end            *envdwire.EndEvent
	rpcErr         *rpcError
}

// collect reads a process stream to its end, within a generous deadline.
func collect(t *testing.T, ch <-chan streamEvent) result {
	t.Helper()
	var r result
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatalf("stream closed without an end envelope: %+v", r)
			}
			switch {
			case e.err != nil:
				t.Fatalf("stream broke: %v (so far %+v)", e.err, r)
			case e.end != nil:
				if e.end.Code != "" {
					r.rpcErr = e.end
				}
				return r
			case e.ev.Start != nil:
				r.pid = e.ev.Start.Pid
			case e.ev.Data != nil:
				r.stdout += string(e.ev.Data.Stdout)
				r.stderr += string(e.ev.Data.Stderr)
				r.pty += string(e.ev.Data.Pty)
			case e.ev.End != nil:
				r.end = e.ev.End
			}
		case <-deadline:
			t.Fatalf("no end of stream in 2 minutes: %+v", r)
		}
	}
}

// waitStart reads a stream up to its start event and returns the pid.
func waitStart(t *testing.T, ch <-chan streamEvent) uint32 {
	t.Helper()
	select {
	case e := <-ch:
		if e.ev == nil || e.ev.Start == nil {
			t.Fatalf("first message %+v, want a start event", e)
		}
		return e.ev.Start.Pid
	case <-time.After(2 * time.Minute):
		t.Fatal("no start event in 2 minutes")
	}
	return 0
}

func run(cmd string) *envdwire.StartRequest {
	no := false
	return &envdwire.StartRequest{Process: &envdwire.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd}}, Stdin: &no}
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// rawStream starts a server-streaming call with a marshalled request.
func (c *envdClient) rawStream(ctx context.Context, t *testing.T, proc string, b []byte) *http.Response {
	t.Helper()
	var env bytes.Buffer
	env.WriteByte(0)
	binary.Write(&env, binary.BigEndian, uint32(len(b)))
	env.Write(b)
	hr, _ := http.NewRequestWithContext(ctx, "POST", c.url+proc, &env)
	hr.Header.Set("Content-Type", "application/connect+json")
	c.header(hr)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d", proc, resp.StatusCode)
	}
	return resp
}

// readEnvelopes sends each message envelope's JSON to out, and closes it
// at the end envelope or when the stream breaks.
func readEnvelopes(r io.Reader, out chan<- string) {
	defer close(out)
	br := bufio.NewReader(r)
	for {
		var h [5]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return
		}
		p := make([]byte, binary.BigEndian.Uint32(h[1:]))
		if _, err := io.ReadFull(br, p); err != nil || h[0] == 2 {
			return
		}
		out <- string(p)
	}
}
