package osfake_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/opensandbox/osfake"
)

const key = "k"

// client speaks raw HTTP to a fake, the way the spec describes the wire.
type client struct {
	t   *testing.T
	srv *osfake.Server
}

func newServer(t *testing.T, opts osfake.Options) *client {
	t.Helper()
	opts.APIKey = key
	srv, err := osfake.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return &client{t: t, srv: srv}
}

func (c *client) do(method, path string, body io.Reader, hdr map[string]string) *http.Response {
	c.t.Helper()
	req, err := http.NewRequest(method, c.srv.URL()+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp
}

// want checks the status and decodes the body into v (when not nil).
func (c *client) want(resp *http.Response, status int, v any) {
	c.t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		c.t.Fatalf("%s %s: %d %s, want %d", resp.Request.Method, resp.Request.URL.Path, resp.StatusCode, b, status)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			c.t.Fatalf("decode %s: %v", b, err)
		}
	}
}

type apiErr struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (c *client) wantErr(resp *http.Response, status int, code string) {
	c.t.Helper()
	var e apiErr
	c.want(resp, status, &e)
	if e.Code != code || e.Message == "" {
		c.t.Errorf("%s %s: error %+v, want code %s and a message", resp.Request.Method, resp.Request.URL.Path, e, code)
	}
}

type sandboxJSON struct {
	ID     string `json:"id"`
	Status struct {
		State string `json:"state"`
	} `json:"status"`
	Metadata map[string]string `json:"metadata"`
}

func (c *client) create(body string) string {
	c.t.Helper()
	resp := c.do("POST", "/v1/sandboxes", strings.NewReader(body), nil)
	if loc := resp.Header.Get("Location"); !strings.HasPrefix(loc, "/v1/sandboxes/") {
		c.t.Errorf("create: Location %q", loc)
	}
	var sb sandboxJSON
	c.want(resp, http.StatusAccepted, &sb)
	if sb.Status.State != "Pending" {
		c.t.Errorf("create answered state %q, want Pending", sb.Status.State)
	}
	return sb.ID
}

func (c *client) state(id string) string {
	var sb sandboxJSON
	c.want(c.do("GET", "/v1/sandboxes/"+id, nil, nil), http.StatusOK, &sb)
	return sb.Status.State
}

func (c *client) waitState(id, want string) {
	c.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.state(id) != want {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s never reached %s", id, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const minimal = `{"image":{"uri":"ubuntu"},"entrypoint":["tail","-f","/dev/null"],"resourceLimits":{"cpu":"1"}}`

// running creates a sandbox, waits for it and returns its id and execd's
// base URL and token.
func (c *client) running() (id, base, token string) {
	c.t.Helper()
	id = c.create(minimal)
	c.waitState(id, "Running")
	var ep struct {
		Endpoint string            `json:"endpoint"`
		Headers  map[string]string `json:"headers"`
	}
	c.want(c.do("GET", "/v1/sandboxes/"+id+"/endpoints/44772", nil, nil), http.StatusOK, &ep)
	u, _ := url.Parse(c.srv.URL())
	if !strings.HasPrefix(ep.Endpoint, u.Host+"/") || ep.Headers["X-EXECD-ACCESS-TOKEN"] == "" {
		c.t.Fatalf("endpoint %+v", ep)
	}
	return id, strings.TrimPrefix(ep.Endpoint, u.Host), ep.Headers["X-EXECD-ACCESS-TOKEN"]
}

func TestLifecycleStatusCodes(t *testing.T) {
	c := newServer(t, osfake.Options{ProvisionDelay: time.Second, PauseDelay: time.Second, ResumeDelay: time.Second})
	id := c.create(minimal)
	c.wantErr(c.do("POST", "/v1/sandboxes/"+id+"/pause", nil, nil), http.StatusConflict, "DOCKER::SANDBOX_NOT_RUNNING")
	c.waitState(id, "Running")
	c.want(c.do("POST", "/v1/sandboxes/"+id+"/pause", nil, nil), http.StatusAccepted, nil)
	if st := c.state(id); st != "Pausing" {
		t.Errorf("right after pause: %s, want Pausing", st)
	}
	c.wantErr(c.do("POST", "/v1/sandboxes/"+id+"/pause", nil, nil), http.StatusConflict, "DOCKER::SANDBOX_NOT_RUNNING")
	c.wantErr(c.do("POST", "/v1/sandboxes/"+id+"/resume", nil, nil), http.StatusConflict, "DOCKER::SANDBOX_NOT_PAUSED")
	c.waitState(id, "Paused")
	c.want(c.do("POST", "/v1/sandboxes/"+id+"/resume", nil, nil), http.StatusAccepted, nil)
	if st := c.state(id); st != "Resuming" {
		t.Errorf("right after resume: %s, want Resuming", st)
	}
	c.waitState(id, "Running")
	if c.srv.Live() != 1 {
		t.Errorf("Live = %d", c.srv.Live())
	}
	c.want(c.do("DELETE", "/v1/sandboxes/"+id, nil, nil), http.StatusNoContent, nil)
	c.wantErr(c.do("GET", "/v1/sandboxes/"+id, nil, nil), http.StatusNotFound, "DOCKER::SANDBOX_NOT_FOUND")
	c.wantErr(c.do("DELETE", "/v1/sandboxes/"+id, nil, nil), http.StatusNotFound, "DOCKER::SANDBOX_NOT_FOUND")
	c.wantErr(c.do("POST", "/v1/sandboxes/"+id+"/pause", nil, nil), http.StatusNotFound, "DOCKER::SANDBOX_NOT_FOUND")
	if c.srv.Live() != 0 {
		t.Errorf("Live = %d after delete", c.srv.Live())
	}
}

func TestAuthValidationAndRateLimit(t *testing.T) {
	c := newServer(t, osfake.Options{})
	c.wantErr(c.do("GET", "/v1/sandboxes", nil, map[string]string{"OPEN-SANDBOX-API-KEY": ""}), http.StatusUnauthorized, "MISSING_API_KEY")
	c.wantErr(c.do("GET", "/v1/sandboxes", nil, map[string]string{"OPEN-SANDBOX-API-KEY": "nope"}), http.StatusUnauthorized, "INVALID_API_KEY")

	for _, tc := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"image":{"uri":"u"},"entrypoint":["x"],"timeout":30}`, 422, ""},
		{`{"entrypoint":["x"]}`, 400, "SANDBOX::INVALID_PARAMETER"},
		{`{"image":{"uri":"u"}}`, 400, "DOCKER::INVALID_ENTRYPOINT"},
		{`{"image":{"uri":"u"},"entrypoint":["x"],"metadata":{"k":"has space"}}`, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{`{"image":{"uri":"u"},"entrypoint":["x"],"metadata":{"opensandbox.io/id":"x"}}`, 400, "SANDBOX::INVALID_METADATA_LABEL"},
	} {
		resp := c.do("POST", "/v1/sandboxes", strings.NewReader(tc.body), nil)
		if tc.status == 422 {
			var d struct {
				Detail []map[string]any `json:"detail"`
			}
			c.want(resp, 422, &d)
			if len(d.Detail) == 0 {
				t.Errorf("%s: 422 without detail", tc.body)
			}
			continue
		}
		c.wantErr(resp, tc.status, tc.code)
	}
	if c.srv.Created() != 0 {
		t.Errorf("invalid creates made %d sandboxes", c.srv.Created())
	}

	c.srv.RateLimit("GET /v1/sandboxes", 2, 1500*time.Millisecond)
	for i := 0; i < 2; i++ {
		resp := c.do("GET", "/v1/sandboxes", nil, nil)
		if ra := resp.Header.Get("Retry-After"); ra != "2" {
			t.Errorf("Retry-After %q, want whole seconds rounded up", ra)
		}
		c.wantErr(resp, http.StatusTooManyRequests, "TOO_MANY_REQUESTS")
	}
	c.want(c.do("GET", "/v1/sandboxes", nil, nil), http.StatusOK, nil)
}

func TestListFiltersAndPages(t *testing.T) {
	c := newServer(t, osfake.Options{})
	for i := 0; i < 5; i++ {
		c.create(fmt.Sprintf(`{"image":{"uri":"u"},"entrypoint":["x"],"metadata":{"team":"t%d","all":"yes"}}`, i%2))
	}
	var lr struct {
		Items      []sandboxJSON `json:"items"`
		Pagination struct {
			TotalItems  int  `json:"totalItems"`
			HasNextPage bool `json:"hasNextPage"`
		} `json:"pagination"`
	}
	c.want(c.do("GET", "/v1/sandboxes?pageSize=2&metadata="+url.QueryEscape("team=t0&all=yes"), nil, nil), 200, &lr)
	if lr.Pagination.TotalItems != 3 || len(lr.Items) != 2 || !lr.Pagination.HasNextPage {
		t.Errorf("filtered page 1: %+v", lr)
	}
	c.want(c.do("GET", "/v1/sandboxes?pageSize=2&page=2&metadata="+url.QueryEscape("team=t0"), nil, nil), 200, &lr)
	if len(lr.Items) != 1 || lr.Pagination.HasNextPage {
		t.Errorf("filtered page 2: %+v", lr)
	}
	c.want(c.do("GET", "/v1/sandboxes?state=Paused", nil, nil), 200, &lr)
	if lr.Pagination.TotalItems != 0 {
		t.Errorf("state filter: %+v", lr)
	}
}

// event is one decoded event of execd's command stream.
type event struct {
	Type  string `json:"type"`
	Text  string `json:"text"`
	Error *struct {
		EValue    string   `json:"evalue"`
		Traceback []string `json:"traceback"`
	} `json:"error"`
}

// command posts a command and returns the raw stream body.
func (c *client) command(base, token, body string) *http.Response {
	c.t.Helper()
	resp := c.do("POST", base+"/command", strings.NewReader(body), map[string]string{"X-EXECD-ACCESS-TOKEN": token})
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("command: %d %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		c.t.Errorf("command Content-Type %q", ct)
	}
	return resp
}

// events reads the stream until its terminal event; every event must be a
// bare JSON object followed by a blank line.
func events(t *testing.T, r io.Reader) []event {
	t.Helper()
	br := bufio.NewReader(r)
	var out []event
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended (%v) after %+v", err, out)
		}
		blank, _ := br.ReadString('\n')
		if blank != "\n" || !strings.HasPrefix(line, "{") {
			t.Fatalf("framing: %q then %q", line, blank)
		}
		var ev event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
		if ev.Type == "execution_complete" || ev.Type == "error" {
			return out
		}
	}
}

func TestCommandStream(t *testing.T) {
	c := newServer(t, osfake.Options{})
	_, base, token := c.running()

	resp := c.do("POST", base+"/command", strings.NewReader(`{"command":"true"}`), nil)
	var unauth struct {
		Error string `json:"error"`
	}
	c.want(resp, http.StatusUnauthorized, &unauth)
	if unauth.Error == "" {
		t.Error("execd's 401 has an error field")
	}
	c.wantErr(c.do("POST", base+"/command", strings.NewReader(`{"command":"true","cwd":"/nope"}`), map[string]string{"X-EXECD-ACCESS-TOKEN": token}),
		http.StatusBadRequest, "INVALID_REQUEST_BODY")
	c.wantErr(c.do("POST", base+"/command", strings.NewReader(`{"cwd":"/"}`), map[string]string{"X-EXECD-ACCESS-TOKEN": token}),
		http.StatusBadRequest, "INVALID_REQUEST_BODY")

	for _, tc := range []struct {
		cmd    string
		lines  []string // stdout event texts
		final  string
		evalue string
		tb     string
	}{
		{`printf 'a\n\nb\r\nc'; echo err >&2`, []string{"a", "\n", "b", "c"}, "execution_complete", "", ""},
		{"exit 3", nil, "error", "3", "exit status 3"},
		{"kill -9 $$", nil, "error", "-1", "signal: killed"},
		{"pwd; echo $HOME", []string{"/root", "/root"}, "execution_complete", "", ""},
	} {
		body, _ := json.Marshal(map[string]any{"command": tc.cmd, "cwd": "/root"})
		resp := c.command(base, token, string(body))
		evs := events(t, resp.Body)
		resp.Body.Close()
		if evs[0].Type != "init" || evs[0].Text == "" {
			t.Errorf("%s: first event %+v, want init with the command id", tc.cmd, evs[0])
		}
		var lines []string
		for _, ev := range evs {
			if ev.Type == "stdout" {
				lines = append(lines, ev.Text)
			}
		}
		last := evs[len(evs)-1]
		if strings.Join(lines, "|") != strings.Join(tc.lines, "|") || last.Type != tc.final {
			t.Errorf("%s: stdout events %q, last %+v", tc.cmd, lines, last)
		}
		if tc.final == "error" && (last.Error == nil || last.Error.EValue != tc.evalue || len(last.Error.Traceback) == 0 || last.Error.Traceback[0] != tc.tb) {
			t.Errorf("%s: error event %+v, want evalue %s traceback %q", tc.cmd, last.Error, tc.evalue, tc.tb)
		}
	}
}

// TestCommandOutlivesClient: as in execd, a client that disconnects does
// not stop its command; an interrupt or the command's timeout does.
func TestCommandOutlivesClient(t *testing.T) {
	c := newServer(t, osfake.Options{})
	_, base, token := c.running()
	resp := c.command(base, token, `{"command":"sleep 60"}`)
	var init event
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	json.Unmarshal([]byte(line), &init)
	resp.Body.Close()
	time.Sleep(200 * time.Millisecond)
	if n := c.srv.RunningCommands(); n != 1 {
		t.Fatalf("after the client left: %d commands running, want 1", n)
	}
	var st struct {
		Running bool `json:"running"`
	}
	c.want(c.do("GET", base+"/command/status/"+init.Text, nil, map[string]string{"X-EXECD-ACCESS-TOKEN": token}), 200, &st)
	if !st.Running {
		t.Error("status says not running")
	}
	c.want(c.do("DELETE", base+"/command?id="+init.Text, nil, map[string]string{"X-EXECD-ACCESS-TOKEN": token}), 200, nil)
	if n := c.srv.RunningCommands(); n != 0 {
		t.Errorf("after interrupt: %d running", n)
	}
	c.wantErr(c.do("DELETE", base+"/command?id="+init.Text, nil, map[string]string{"X-EXECD-ACCESS-TOKEN": token}), 500, "RUNTIME_ERROR")

	resp = c.command(base, token, `{"command":"sleep 60","timeout":200}`)
	evs := events(t, resp.Body)
	resp.Body.Close()
	if last := evs[len(evs)-1]; last.Error == nil || last.Error.EValue != "-1" {
		t.Errorf("a command past its timeout ended with %+v", last)
	}
	if n := c.srv.RunningCommands(); n != 0 {
		t.Errorf("after a timeout: %d running", n)
	}
}

// TestFrozenWhilePaused: execd of a paused sandbox does not answer; a call
// waits for the sandbox to run again, or fails after FrozenTimeout.
func TestFrozenWhilePaused(t *testing.T) {
	c := newServer(t, osfake.Options{FrozenTimeout: 300 * time.Millisecond})
	id, base, token := c.running()
	c.want(c.do("POST", "/v1/sandboxes/"+id+"/pause", nil, nil), http.StatusAccepted, nil)
	start := time.Now()
	c.wantErr(c.do("GET", base+"/ping", nil, map[string]string{"X-EXECD-ACCESS-TOKEN": token}), 500, "GENERAL::UNKNOWN_ERROR")
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("a call to a frozen execd failed after %v, not after hanging", took)
	}
	c.waitState(id, "Paused")
	c.want(c.do("POST", "/v1/sandboxes/"+id+"/resume", nil, nil), http.StatusAccepted, nil)
	c.want(c.do("GET", base+"/ping", nil, map[string]string{"X-EXECD-ACCESS-TOKEN": token}), 200, nil)
	c.want(c.do("DELETE", "/v1/sandboxes/"+id, nil, nil), http.StatusNoContent, nil)
	c.wantErr(c.do("GET", base+"/ping", nil, map[string]string{"X-EXECD-ACCESS-TOKEN": token}), 404, "DOCKER::SANDBOX_NOT_FOUND")
}

func upload(t *testing.T, metaName, metaFile, path, data string) (*bytes.Buffer, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	h := textproto.MIMEHeader{}
	disp := fmt.Sprintf(`form-data; name=%q`, metaName)
	if metaFile != "" {
		disp += fmt.Sprintf(`; filename=%q`, metaFile)
	}
	h.Set("Content-Disposition", disp)
	w, _ := mw.CreatePart(h)
	fmt.Fprintf(w, `{"path":%q,"mode":640}`, path)
	fw, _ := mw.CreateFormFile("file", "f")
	io.WriteString(fw, data)
	mw.Close()
	return &b, mw.FormDataContentType()
}

func TestFilesAPI(t *testing.T) {
	c := newServer(t, osfake.Options{})
	id, base, token := c.running()
	tok := map[string]string{"X-EXECD-ACCESS-TOKEN": token}
	withType := func(ct string) map[string]string {
		return map[string]string{"X-EXECD-ACCESS-TOKEN": token, "Content-Type": ct}
	}

	body, ct := upload(t, "metadata", "", "/a/b.txt", "data")
	c.wantErr(c.do("POST", base+"/files/upload", body, withType(ct)), 400, "INVALID_FILE_METADATA")
	body, ct = upload(t, "metadata", "metadata", "/a/b.txt", "data")
	c.want(c.do("POST", base+"/files/upload", body, withType(ct)), 200, nil)

	var info map[string]struct {
		Path string `json:"path"`
		Type string `json:"type"`
		Size int64  `json:"size"`
		Mode int    `json:"mode"`
	}
	c.want(c.do("GET", base+"/files/info?path=/a/b.txt&path=~", nil, tok), 200, &info)
	if f := info["/a/b.txt"]; f.Type != "file" || f.Size != 4 || f.Mode != 640 {
		t.Errorf("info of the upload: %+v", f)
	}
	if h := info["~"]; h.Path != "/root" || h.Type != "directory" {
		t.Errorf("info of ~: %+v", h)
	}
	c.wantErr(c.do("GET", base+"/files/info?path=/missing", nil, tok), 404, "FILE_NOT_FOUND")
	c.wantErr(c.do("GET", base+"/files/info?path=/a/$UNDEFINED", nil, tok), 500, "RUNTIME_ERROR")
	c.wantErr(c.do("GET", base+"/directories/list?path=/a/b.txt", nil, tok), 400, "INVALID_REQUEST_BODY")
	c.wantErr(c.do("GET", base+"/directories/list?path=/nope", nil, tok), 404, "FILE_NOT_FOUND")

	resp := c.do("GET", base+"/files/download?path=/a/b.txt", nil, map[string]string{"X-EXECD-ACCESS-TOKEN": token, "Range": "bytes=1-2"})
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 206 || string(b) != "at" {
		t.Errorf("range download: %d %q", resp.StatusCode, b)
	}
	resp.Body.Close()

	mv := func(src, dst string) *http.Response {
		return c.do("POST", base+"/files/mv", strings.NewReader(fmt.Sprintf(`[{"src":%q,"dest":%q}]`, src, dst)), tok)
	}
	body, ct = upload(t, "metadata", "metadata", "/a/c.txt", "c")
	c.want(c.do("POST", base+"/files/upload", body, withType(ct)), 200, nil)
	c.wantErr(mv("/a/c.txt", "/a/b.txt"), 500, "RUNTIME_ERROR")
	c.wantErr(mv("/a/none", "/a/x"), 404, "FILE_NOT_FOUND")
	c.want(mv("/a/c.txt", "/new/dir/c.txt"), 200, nil)

	c.wantErr(c.do("DELETE", base+"/files?path=/a", nil, tok), 500, "RUNTIME_ERROR")
	c.want(c.do("DELETE", base+"/files?path=/missing", nil, tok), 200, nil)
	c.want(c.do("DELETE", base+"/directories?path=/a", nil, tok), 200, nil)
	c.wantErr(c.do("GET", base+"/files/info?path=/a", nil, tok), 404, "FILE_NOT_FOUND")

	// ".." never leaves the sandbox root.
	body, ct = upload(t, "metadata", "metadata", "/../../../escape.txt", "e")
	c.want(c.do("POST", base+"/files/upload", body, withType(ct)), 200, nil)
	if _, err := os.Stat(c.srv.Root(id) + "/escape.txt"); err != nil {
		t.Errorf("an upload to /../../../escape.txt did not land in the root: %v", err)
	}
}

// TestCommandsSeeTheSandbox: commands run chrooted in the root, so they and
// the file API agree on paths; the host's system directories are read-only
// inside; nothing is mounted in the host's namespace.
func TestCommandsSeeTheSandbox(t *testing.T) {
	c := newServer(t, osfake.Options{})
	id, base, token := c.running()
	tok := map[string]string{"X-EXECD-ACCESS-TOKEN": token}
	resp := c.command(base, token, `{"command":"echo made > /tmp/by-command; touch /usr/osfake-probe 2>/dev/null && echo writable || echo read-only"}`)
	evs := events(t, resp.Body)
	resp.Body.Close()
	var out []string
	for _, ev := range evs {
		if ev.Type == "stdout" {
			out = append(out, ev.Text)
		}
	}
	if strings.Join(out, "|") != "read-only" {
		t.Errorf("touch under /usr inside the sandbox: %q", out)
	}
	var info map[string]struct {
		Size int64 `json:"size"`
	}
	c.want(c.do("GET", base+"/files/info?path=/tmp/by-command", nil, tok), 200, &info)
	if info["/tmp/by-command"].Size != 5 {
		t.Errorf("the command's /tmp/by-command: %+v", info)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if root := c.srv.Root(id); bytes.Contains(mounts, []byte(root)) {
		t.Errorf("the host's mount table shows the sandbox root %s", root)
	}
}

func TestEndpointAndProxyStates(t *testing.T) {
	c := newServer(t, osfake.Options{ProvisionDelay: time.Second, ExecdStartDelay: 5 * time.Second})
	id := c.create(minimal)
	c.wantErr(c.do("GET", "/v1/sandboxes/"+id+"/endpoints/44772", nil, nil), 404, "DOCKER::SANDBOX_NOT_FOUND")
	c.wantErr(c.do("GET", "/v1/sandboxes/"+id+"/endpoints/0", nil, nil), 400, "DOCKER::INVALID_PORT")
	c.wantErr(c.do("GET", "/v1/sandboxes/"+id+"/endpoints/44772?expires=100", nil, nil), 400, "SANDBOX::API_NOT_SUPPORTED")
	c.waitState(id, "Running")
	c.wantErr(c.do("GET", "/sandboxes/"+id+"/proxy/44772/ping", nil, nil), 502, "GENERAL::UNKNOWN_ERROR")
	c.wantErr(c.do("GET", "/sandboxes/"+id+"/proxy/8080/", nil, nil), 502, "GENERAL::UNKNOWN_ERROR")
}
