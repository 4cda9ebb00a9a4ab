package cubefake_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/cubesandbox/cubefake"
	"github.com/esf-dev/esf/adapters/workspace/e2b/e2bfake"
	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// TestWireDialect speaks raw HTTP to the fake and checks what Cube's
// dialect changes on the wire, step by step through one sandbox's life.
func TestWireDialect(t *testing.T) {
	srv, err := cubefake.New(cubefake.Options{APIKey: "k", Dir: t.TempDir(), PauseDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	do := func(method, path, body, auth string) (int, http.Header, string) {
		t.Helper()
		return e2bfake.Do(t, method, srv.URL+path, body, map[string]string{"Authorization": auth})
	}
	const bearer, api = "Bearer k", "/cubeapi/v1"
	status, _, body := do("POST", api+"/sandboxes", `{"templateID":"t","metadata":{"a":"1"}}`, bearer)
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal([]byte(body), &sb); status != 201 || err != nil || sb.EnvdAccessToken == "" {
		t.Fatalf("create: HTTP %d %s; want 201 and an access token without asking", status, body)
	}
	id := sb.SandboxID
	// state is the sandbox's state and whether it has an end.
	state := func() string {
		_, _, body := do("GET", "/sandboxes/"+id, "", bearer)
		var v struct{ State, EndAt string }
		_ = json.Unmarshal([]byte(body), &v)
		return v.State + map[bool]string{true: " ending", false: " endless"}[v.EndAt != ""]
	}
	steps := []struct {
		method, path, body, auth string
		status                   int
		want                     string // prefix of the answer
		state                    string // state after the step, if not ""
	}{
		{"GET", api + "/sandboxes/" + id, "", "Bearer wrong", 401, `{"code":401`, ""},
		{"GET", api + "/sandboxes/" + id, "", "", 401, `{"code":401`, ""},
		{"POST", api + "/sandboxes/" + id + "/connect", `{}`, bearer, 200, `{"templateID":"t","sandboxID":"` + id, "running ending"},
		{"POST", api + "/sandboxes/" + id + "/pause", "", bearer, 204, "", "pausing ending"},
		{"POST", api + "/sandboxes/" + id + "/pause", "", bearer, 409, `{"code":409`, ""},
		{"POST", api + "/sandboxes/" + id + "/connect", `{}`, bearer, 409, `{"code":409`, ""},
		{"wait", "", "", "", 0, "", "paused ending"},
		{"POST", "/sandboxes/" + id + "/resume", `{}`, bearer, 200, `{"templateID":"t"`, "running ending"}, // resume is connect
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":-1}`, bearer, 204, "", "running endless"},
		{"GET", "/v2/sandboxes?metadata=a%3D2&state=paused", "", bearer, 200, `[{"templateID":"t"`, ""}, // filters ignored
	}
	for _, st := range steps {
		if st.method == "wait" {
			for i := 0; state() != st.state; i++ {
				if i == 100 {
					t.Fatalf("state %q long after the pause delay, want %q", state(), st.state)
				}
				time.Sleep(10 * time.Millisecond)
			}
			continue
		}
		status, _, body := do(st.method, st.path, st.body, st.auth)
		if status != st.status || !strings.HasPrefix(body, st.want) {
			t.Errorf("%s %s: HTTP %d %s, want %d %s", st.method, st.path, status, body, st.status, st.want)
		}
		if got := state(); st.state != "" && got != st.state {
			t.Errorf("after %s %s: state %q, want %q", st.method, st.path, got, st.state)
		}
	}
	if n := srv.Calls("POST /sandboxes/{id}/pause"); n != 2 {
		t.Errorf("Calls counted %d pauses under the unprefixed pattern, want 2", n)
	}

	// The proxy routes by Host alone: E2b-Sandbox-Id is not a route.
	status, _, _ = e2bfake.Do(t, "GET", srv.URL+"/files?path=/etc/hostname", "", map[string]string{envd.HeaderSandboxID: id, "Authorization": bearer})
	if status != http.StatusNotFound {
		t.Errorf("E2b-Sandbox-Id routed to envd: HTTP %d, want the control plane's 404", status)
	}

	// CubeAPI's limiter names no wait, even where E2B's would.
	srv.Server.RateLimit(2, time.Second)
	for range 2 {
		status, hdr, body := do("GET", "/sandboxes/"+id, "", bearer)
		if status != 429 || hdr.Get("Retry-After") != "" || hdr.Get("RateLimit-Reset") != "" || !strings.HasPrefix(body, `{"code":429`) {
			t.Errorf("rate limited: HTTP %d %v %s", status, hdr, body)
		}
	}
}
