package ui

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/fabric"
)

// daemon serves a real Fabric on a temp socket, in process, and returns
// a client of it.
func daemon(t *testing.T) *client.Client {
	t.Helper()
	dir := t.TempDir()
	f, err := fabric.Open(context.Background(), fabric.Options{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "esfd.sock")
	ln, err := api.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.NewServer(f, api.ServerOptions{}).Serve(ctx, ln, 5*time.Second) }()
	c := client.NewClient(sock)
	t.Cleanup(func() {
		c.Close()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		f.Close()
	})
	return c
}

// view starts the view's server of c on a loopback test listener.
func view(t *testing.T, c *client.Client) (*Server, *httptest.Server) {
	t.Helper()
	s, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.Start(ctx)
	hs := httptest.NewServer(s)
	t.Cleanup(func() { hs.Close(); cancel() })
	return s, hs
}

func group(t *testing.T, c *client.Client, files map[string]string) *v1.CreateGroupResult {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	imp, err := c.Import(context.Background(), dir, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := c.CreateGroup(context.Background(), v1.CreateGroupRequest{RootID: imp.RootID.String(), Source: dir}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestServer_Token(t *testing.T) {
	c := daemon(t)
	s, hs := view(t, c)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(cl *http.Client, path, host string, hdr map[string]string, method string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, hs.URL+path, strings.NewReader("{}"))
		if host != "" {
			req.Host = host
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	tok := s.Token()
	for _, c := range []struct {
		name, method, path, host string
		hdr                      map[string]string
		want                     int
	}{
		{"no token", "GET", "/", "", nil, 401},
		{"no token, api", "GET", "/api/groups", "", nil, 401},
		{"no token, asset", "GET", "/static/app.js", "", nil, 401},
		{"wrong token", "GET", "/?token=x" + tok[1:], "", nil, 401},
		{"token in a header is not enough", "GET", "/api/groups", "", map[string]string{"Authorization": "Bearer " + tok}, 401},
		{"not a loopback host", "GET", "/?token=" + tok, "esf.example:80", nil, 403},
		{"mutation without X-Esf-UI", "POST", "/api/fork?token=" + tok, "", nil, 403},
		{"token: cookie and out of the address bar", "GET", "/?token=" + tok, "", nil, 303},
		{"token on an api path", "GET", "/api/groups?token=" + tok, "", nil, 200},
	} {
		if got := get(noRedirect, c.path, c.host, c.hdr, c.method).StatusCode; got != c.want {
			t.Errorf("%s: %s %s: %d, want %d", c.name, c.method, c.path, got, c.want)
		}
	}

	// A browser: the cookie from the token URL opens everything else.
	jar, _ := cookiejar.New(nil)
	br := &http.Client{Jar: jar}
	resp := get(br, "/?token="+tok, "", nil, "GET")
	if resp.StatusCode != 200 || resp.Request.URL.RawQuery != "" {
		t.Fatalf("token URL: %d at %s", resp.StatusCode, resp.Request.URL)
	}
	for _, p := range []string{"/", "/static/app.js", "/static/app.css", "/api/groups"} {
		if got := get(br, p, "", nil, "GET").StatusCode; got != 200 {
			t.Errorf("GET %s with the cookie: %d", p, got)
		}
	}
	if ck := resp.Request.Response.Cookies(); len(ck) != 1 || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode {
		t.Errorf("cookie %+v, want one HttpOnly SameSite=Strict", ck)
	}
}

func TestServer_GroupsTreeFiles(t *testing.T) {
	c := daemon(t)
	g := group(t, c, map[string]string{"a.txt": "alpha\n", "dir/b.txt": "beta\n"})
	ctx := context.Background()
	kids, err := c.Fork(ctx, v1.ForkRequest{NodeID: g.Node.NodeID, N: 2}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, hs := view(t, c)
	getJSON := func(path string, v any) int {
		t.Helper()
		resp, err := http.Get(hs.URL + path + sep(path) + "token=" + s.Token())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if v != nil && resp.StatusCode == 200 {
			if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode
	}
	var gs GroupsResponse
	if st := getJSON("/api/groups", &gs); st != 200 || len(gs.Groups) != 1 || gs.Groups[0].Nodes != 3 ||
		gs.Groups[0].CanonicalNodeID != g.Node.NodeID || gs.Groups[0].Generation != 1 {
		t.Fatalf("groups: %d %+v", st, gs)
	}
	var tree v1.TreeResponse
	if st := getJSON("/api/tree/"+g.Group.GroupID, &tree); st != 200 || len(tree.Nodes) != 3 {
		t.Fatalf("tree: %d %+v", st, tree)
	}
	var ls struct {
		Entries []Entry `json:"entries"`
	}
	if st := getJSON("/api/ls?id="+kids.Nodes[0].NodeID+"&path=dir", &ls); st != 200 || len(ls.Entries) != 1 ||
		ls.Entries[0].Name != "b.txt" || ls.Entries[0].Type != "file" || ls.Entries[0].Size != 5 {
		t.Fatalf("ls dir: %d %+v", st, ls)
	}
	if st := getJSON("/api/ls?id="+g.Node.RootID+"&path=nope", nil); st != 404 {
		t.Errorf("ls of a missing directory: %d", st)
	}
	resp, err := http.Get(hs.URL + "/api/file?id=" + g.Node.RootID + "&path=dir/b.txt&token=" + s.Token())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "beta\n" || !strings.Contains(resp.Header.Get("Content-Disposition"), `filename=b.txt`) {
		t.Errorf("file: %d %q %q", resp.StatusCode, body, resp.Header.Get("Content-Disposition"))
	}
	if st := getJSON("/api/file?id="+g.Node.RootID+"&path=dir", nil); st != 400 {
		t.Errorf("file of a directory: %d", st)
	}
}

func sep(p string) string {
	if strings.Contains(p, "?") {
		return "&"
	}
	return "?"
}

func TestListenLoopback(t *testing.T) {
	for _, a := range []string{"0.0.0.0:0", "10.1.2.3:0", ":0", "example.com:80"} {
		if ln, err := ListenLoopback(a); err == nil {
			ln.Close()
			t.Errorf("ListenLoopback(%q) listened", a)
		}
	}
	ln, err := ListenLoopback("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
}

func TestPatchOf(t *testing.T) {
	patch := "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n" +
		"diff --git a/x/y b/x/y\nnew file mode 100644\n+++ b/x/y\n@@ -0,0 +1 @@\n+c\n"
	if got := patchOf([]byte(patch), "x"); got != "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n" {
		t.Errorf("patchOf x: %q", got)
	}
	if got := patchOf([]byte(patch), "x/y"); !strings.HasSuffix(got, "+c\n") || strings.Contains(got, "-a") {
		t.Errorf("patchOf x/y: %q", got)
	}
	if got := patchOf([]byte(patch), "z"); got != "" {
		t.Errorf("patchOf z: %q", got)
	}
}
