package e2bfake_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b/e2bfake"
)

// These tests speak raw HTTP to the fake and check it against the wire
// format in PROTOCOLS.md §1.4-1.7, so the adapter tests run against
// something that looks like envd, not merely like the adapter.

type sandbox struct {
	ID, Token string
}

func newSandbox(t *testing.T, srv *e2bfake.Server) sandbox {
	t.Helper()
	req, _ := http.NewRequest("POST", srv.URL+"/sandboxes", strings.NewReader(`{"templateID":"base","timeout":60,"secure":true}`))
	req.Header.Set("X-API-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: HTTP %d", resp.StatusCode)
	}
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
		EnvdVersion     string `json:"envdVersion"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil {
		t.Fatal(err)
	}
	if sb.SandboxID == "" || sb.EnvdAccessToken == "" || sb.EnvdVersion == "" {
		t.Fatalf("create answer lacks fields: %+v", sb)
	}
	return sandbox{sb.SandboxID, sb.EnvdAccessToken}
}

func fake(t *testing.T) *e2bfake.Server {
	srv, err := e2bfake.New(e2bfake.Options{APIKey: "k", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

func envelope(flags byte, payload string) []byte {
	b := make([]byte, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:5], uint32(len(payload)))
	copy(b[5:], payload)
	return b
}

type frame struct {
	flags   byte
	payload string
}

func readFrames(t *testing.T, r io.Reader) []frame {
	t.Helper()
	var out []frame
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatalf("frame header: %v", err)
		}
		p := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(r, p); err != nil {
			t.Fatalf("frame payload: %v", err)
		}
		out = append(out, frame{hdr[0], string(p)})
	}
}

func start(t *testing.T, srv *e2bfake.Server, sb sandbox, body string, hdr map[string]string) (*http.Response, []frame) {
	t.Helper()
	req, _ := http.NewRequest("POST", srv.URL+"/process.Process/Start", bytes.NewReader(envelope(0, body)))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("E2b-Sandbox-Id", sb.ID)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", sb.Token)
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp, readFrames(t, resp.Body)
}

func TestWireProcessStream(t *testing.T) {
	srv := fake(t)
	sb := newSandbox(t, srv)
	cases := []struct {
		name, cmd string
		hdr       map[string]string
		// want: the data frames' events, the end event and the trailer.
		wantData  []string
		wantEnd   string
		wantTrail string
	}{
		{
			name:      "exit3",
			cmd:       `echo hi; echo err >&2; exit 3`,
			wantData:  []string{`{"event":{"data":{"stdout":"aGkK"}}}`, `{"event":{"data":{"stderr":"ZXJyCg=="}}}`},
			wantEnd:   `{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}`,
			wantTrail: `{}`,
		},
		{
			name:      "exit0 omits exitCode",
			cmd:       `true`,
			wantEnd:   `{"event":{"end":{"exited":true,"status":"exit status 0"}}}`,
			wantTrail: `{}`,
		},
		{
			name:      "timeout kills with deadline_exceeded",
			cmd:       `sleep 5`,
			hdr:       map[string]string{"Connect-Timeout-Ms": "200"},
			wantTrail: `{"error":{"code":"deadline_exceeded"`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"process":{"cmd":"/bin/sh","args":["-c",` + mustJSON(tc.cmd) + `]},"stdin":false}`
			resp, frames := start(t, srv, sb, body, tc.hdr)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
				t.Fatalf("HTTP %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			if len(frames) < 2 {
				t.Fatalf("frames = %+v", frames)
			}
			if f := frames[0]; f.flags != 0 || !strings.HasPrefix(f.payload, `{"event":{"start":{"pid":`) {
				t.Errorf("first frame %+v, want start event", f)
			}
			last := frames[len(frames)-1]
			if last.flags != 0x02 || !strings.HasPrefix(last.payload, tc.wantTrail) {
				t.Errorf("end-of-stream frame %+v, want flags 2 and %s", last, tc.wantTrail)
			}
			mid := frames[1 : len(frames)-1]
			var data []string
			var end string
			for _, f := range mid {
				if f.flags != 0 {
					t.Errorf("data frame with flags %d", f.flags)
				}
				if strings.Contains(f.payload, `"end"`) {
					end = f.payload
				} else {
					data = append(data, f.payload)
				}
			}
			if end != tc.wantEnd {
				t.Errorf("end event %s, want %s", end, tc.wantEnd)
			}
			// stdout and stderr are separate pipes: their relative order is
			// not defined, on envd either.
			sort.Strings(data)
			want := append([]string(nil), tc.wantData...)
			sort.Strings(want)
			if strings.Join(data, "|") != strings.Join(want, "|") {
				t.Errorf("data events %q, want %q", data, tc.wantData)
			}
		})
	}
	// The timed-out process is killed by envd's own timer; give the reaper
	// a moment.
	for i := 0; srv.Processes() != 0; i++ {
		if i == 100 {
			t.Fatalf("%d processes left", srv.Processes())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWireMissingCwdIsEndStreamError(t *testing.T) {
	srv := fake(t)
	sb := newSandbox(t, srv)
	resp, frames := start(t, srv, sb, `{"process":{"cmd":"/bin/sh","args":["-c","true"],"cwd":"/nope"}}`, nil)
	if resp.StatusCode != 200 || len(frames) != 1 || frames[0].flags != 2 ||
		frames[0].payload != `{"error":{"code":"invalid_argument","message":"cwd '/nope' does not exist"}}` {
		t.Fatalf("HTTP %d frames %+v", resp.StatusCode, frames)
	}
}

func TestWireUnaryErrorsAndAuth(t *testing.T) {
	srv := fake(t)
	sb := newSandbox(t, srv)
	post := func(path, body string, token string) (int, string) {
		status, _, b := e2bfake.Do(t, "POST", srv.URL+path, body, map[string]string{"Content-Type": "application/json",
			"Connect-Protocol-Version": "1", "E2b-Sandbox-Id": sb.ID, "X-Access-Token": token})
		return status, b
	}
	for _, tc := range []struct {
		path, body, token string
		status            int
		want              string
	}{
		{"/filesystem.Filesystem/Stat", `{"path":"/nope"}`, sb.Token, 404, `{"code":"not_found","message":"file not found: /nope"}`},
		{"/filesystem.Filesystem/MakeDir", `{"path":"/home/user"}`, sb.Token, 409, `{"code":"already_exists","message":"directory already exists: /home/user"}`},
		{"/filesystem.Filesystem/ListDir", `{"path":"/nope"}`, sb.Token, 404, `{"code":"not_found"`},
		{"/filesystem.Filesystem/Remove", `{"path":"/nope"}`, sb.Token, 200, `{}`},
		{"/filesystem.Filesystem/Stat", `{"path":"x"}`, "", 401, `{"code":401,"message":"unauthorized access`},
		{"/filesystem.Filesystem/Stat", `{"path":"/home"}`, sb.Token, 200, `{"entry":{"name":"home","type":"FILE_TYPE_DIRECTORY","path":"/home",`},
	} {
		status, body := post(tc.path, tc.body, tc.token)
		if status != tc.status || !strings.HasPrefix(body, tc.want) {
			t.Errorf("%s %s: HTTP %d %s, want %d %s", tc.path, tc.body, status, body, tc.status, tc.want)
		}
	}
	// Files API: JSON errors with numeric codes; a missing sandbox is the
	// proxy's 502.
	get := func(id, p string) (int, string) {
		status, _, b := e2bfake.Do(t, "GET", srv.URL+"/files?path="+p+"&username=user", "",
			map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": sb.Token})
		return status, b
	}
	for _, tc := range []struct {
		id, path string
		status   int
		want     string
	}{
		{sb.ID, "/home", 400, `{"code":400,"message":"path '/home' is a directory"}`},
		{sb.ID, "/nope", 404, `{"code":404,"message":"path '/nope' does not exist"}`},
		{"missing", "/x", 502, `{"code":502,"message":"The sandbox was not found","sandboxId":"missing"}`},
	} {
		status, body := get(tc.id, tc.path)
		if status != tc.status || body != tc.want {
			t.Errorf("GET /files %s: HTTP %d %s, want %d %s", tc.path, status, body, tc.status, tc.want)
		}
	}
}

func TestWireControlPlane(t *testing.T) {
	srv := fake(t)
	do := func(method, path, body, key string) (int, http.Header, string) {
		return e2bfake.Do(t, method, srv.URL+path, body, map[string]string{"X-API-Key": key})
	}
	sb := newSandbox(t, srv)
	id := sb.ID
	steps := []struct {
		method, path, body, key string
		status                  int
		want                    string
	}{
		{"GET", "/sandboxes/" + id, "", "", 401, `{"code":401`},
		{"GET", "/sandboxes/nope", "", "k", 404, `{"code":404,"message":"Sandbox \"nope\" doesn't exist or you don't have access to it"}`},
		{"POST", "/sandboxes/" + id + "/connect", `{"timeout":60}`, "k", 200, `{"templateID":"base","sandboxID":"` + id},
		{"POST", "/sandboxes/" + id + "/pause", "", "k", 204, ``},
		{"POST", "/sandboxes/" + id + "/pause", "", "k", 409, `{"code":409,"message":"Error pausing sandbox - sandbox '` + id + `' is already paused"}`},
		{"GET", "/v2/sandboxes?state=paused", "", "k", 200, `[{"templateID":"base","sandboxID":"` + id},
		{"POST", "/sandboxes/" + id + "/connect", `{"timeout":60}`, "k", 201, `{"templateID":"base","sandboxID":"` + id},
		{"POST", "/sandboxes/" + id + "/resume", `{"timeout":60}`, "k", 409, `{"code":409,"message":"Sandbox ` + id + ` is already running"}`},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":60}`, "k", 204, ``},
		{"POST", "/sandboxes/" + id + "/refreshes", `{"duration":4000}`, "k", 400, `{"code":400`},
		{"DELETE", "/sandboxes/" + id, "", "k", 204, ``},
		{"DELETE", "/sandboxes/" + id, "", "k", 404, `{"code":404`},
	}
	for _, st := range steps {
		status, _, body := do(st.method, st.path, st.body, st.key)
		if status != st.status || !strings.HasPrefix(body, st.want) {
			t.Errorf("%s %s: HTTP %d %s, want %d %s", st.method, st.path, status, body, st.status, st.want)
		}
	}
	srv.RateLimit(1, 1500e6)
	status, hdr, body := do("GET", "/v2/sandboxes", "", "k")
	if status != 429 || hdr.Get("Retry-After") != "2" || body != `{"code":429,"message":"Rate limit exceeded"}` {
		t.Errorf("rate limited: HTTP %d Retry-After %q %s", status, hdr.Get("Retry-After"), body)
	}
	if srv.Count() != 0 {
		t.Errorf("Count = %d after kill", srv.Count())
	}
}

func TestWireListPages(t *testing.T) {
	srv := fake(t)
	var ids []string
	for range 3 {
		ids = append(ids, newSandbox(t, srv).ID)
	}
	seen := map[string]bool{}
	next := ""
	for page := 0; page < 5; page++ {
		req, _ := http.NewRequest("GET", srv.URL+"/v2/sandboxes?limit=2&nextToken="+next, nil)
		req.Header.Set("X-API-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got []struct{ SandboxID string }
		_ = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if resp.Header.Get("X-Total-Running") != "3" {
			t.Errorf("X-Total-Running = %q", resp.Header.Get("X-Total-Running"))
		}
		for _, g := range got {
			if seen[g.SandboxID] {
				t.Errorf("%s listed twice", g.SandboxID)
			}
			seen[g.SandboxID] = true
		}
		if next = resp.Header.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if len(seen) != len(ids) {
		t.Errorf("pages listed %d sandboxes, want %d", len(seen), len(ids))
	}
}

func mustJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
