package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/e2b/envdwire"
)

// files makes a /files request; it returns the status and body.
func (c *envdClient) files(t *testing.T, method, query string, body io.Reader, hdr map[string]string) (int, string) {
	t.Helper()
	r, _ := http.NewRequest(method, c.url+"/files?"+query, body)
	if c.id != "" {
		c.header(r)
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (c *envdClient) sh(t *testing.T, cmd string) string {
	t.Helper()
	_, ch := c.stream(context.Background(), t, envdwire.ProcStart, run(cmd), nil)
	r := collect(t, ch)
	if r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("%s: %+v %+v", cmd, r, r.end)
	}
	return r.stdout
}

// TestFiles: uploads (octet-stream, gzip, multipart) and downloads, the
// filesystem service, what commands and file calls see of each other,
// confinement to the sandbox root, and signed URLs.
func TestFiles(t *testing.T) {
	h := newHarness(t)
	sb := h.create(t, nil)
	c := h.envd(sb)
	q := func(p string) string { return "path=" + url.QueryEscape(p) + "&username=user" }

	if st, body := c.files(t, "POST", q("a/b.txt"), strings.NewReader("hello\n"), map[string]string{"Content-Type": "application/octet-stream"}); st != 200 ||
		!strings.Contains(body, `"path":"/home/user/a/b.txt"`) {
		t.Fatalf("upload: %d %s", st, body)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("zipped"))
	zw.Close()
	if st, body := c.files(t, "POST", q("/tmp/z"), &gz, map[string]string{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}); st != 200 {
		t.Fatalf("gzip upload: %d %s", st, body)
	}
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for _, f := range []string{"/tmp/m1", "m2"} {
		w, _ := mw.CreateFormFile("file", f)
		w.Write([]byte("multi " + f))
	}
	mw.Close()
	if st, body := c.files(t, "POST", "username=user", &mp, map[string]string{"Content-Type": mw.FormDataContentType()}); st != 200 ||
		!strings.Contains(body, "/home/user/m2") {
		t.Fatalf("multipart upload: %d %s", st, body)
	}
	if out := c.sh(t, "cat /home/user/a/b.txt /tmp/z; echo; cat /tmp/m1; echo; cat m2; echo; stat -c %u /tmp/z"); out != "hello\nzipped\nmulti /tmp/m1\nmulti m2\n0\n" {
		t.Fatalf("what the command sees: %q", out)
	}
	c.sh(t, "printf made > /tmp/made; mkdir -p /tmp/d/e; ln -s / /tmp/escape")
	if st, body := c.files(t, "GET", q("/tmp/made"), nil, nil); st != 200 || body != "made" {
		t.Fatalf("download: %d %q", st, body)
	}
	if st, _ := c.files(t, "GET", q("/nope"), nil, nil); st != 404 {
		t.Fatalf("download of a missing file: %d", st)
	}
	// Confined: .. and symlinks resolve inside the sandbox root, where
	// there is no /etc/hostname (the host has one).
	for _, p := range []string{"/../../../../etc/hostname", "/tmp/escape/../../etc/hostname"} {
		if st, body := c.files(t, "GET", q(p), nil, nil); st != 404 {
			t.Fatalf("download %s: %d %q", p, st, body)
		}
	}

	var er envdwire.EntryResponse
	if st, msg := c.unary(t, envdwire.FsStat, &envdwire.PathRequest{Path: "a/b.txt"}, &er); st != 200 || er.Entry.Type != envdwire.FileTypeFile ||
		er.Entry.Size != 6 || er.Entry.Path != "/home/user/a/b.txt" || er.Entry.Name != "b.txt" || er.Entry.Owner != "root" {
		t.Fatalf("stat: %d %s %+v", st, msg, er.Entry)
	}
	if st, _ := c.unary(t, envdwire.FsStat, &envdwire.PathRequest{Path: "/tmp/escape"}, &er); st != 200 || er.Entry.Type != envdwire.FileTypeSymlink ||
		*er.Entry.SymlinkTarget != "/" {
		t.Fatalf("stat of a symlink: %+v", er.Entry)
	}
	if st, _ := c.unary(t, envdwire.FsStat, &envdwire.PathRequest{Path: "/nope"}, nil); st != 404 {
		t.Fatalf("stat of a missing file: %d", st)
	}
	list := func(p string, depth uint32) []string {
		var lr envdwire.ListDirResponse
		if st, msg := c.unary(t, envdwire.FsListDir, &envdwire.ListDirRequest{Path: p, Depth: depth}, &lr); st != 200 {
			t.Fatalf("list %s: %d %s", p, st, msg)
		}
		var out []string
		for _, e := range lr.Entries {
			out = append(out, e.Path)
		}
		sort.Strings(out)
		return out
	}
	if got := fmt.Sprint(list("/tmp/d", 0)); got != "[/tmp/d/e]" {
		t.Fatalf("list depth 1: %s", got)
	}
	c.sh(t, "touch /tmp/d/e/f")
	if got := fmt.Sprint(list("/tmp/d", 2)); got != "[/tmp/d/e /tmp/d/e/f]" {
		t.Fatalf("list depth 2: %s", got)
	}
	if st, _ := c.unary(t, envdwire.FsMakeDir, &envdwire.PathRequest{Path: "/tmp/new/dir"}, &er); st != 200 || er.Entry.Type != envdwire.FileTypeDir {
		t.Fatalf("make dir: %d %+v", st, er.Entry)
	}
	if st, msg := c.unary(t, envdwire.FsMakeDir, &envdwire.PathRequest{Path: "/tmp/new/dir"}, nil); st != 409 || !strings.HasPrefix(msg, "already_exists") {
		t.Fatalf("make an existing dir: %d %s", st, msg)
	}
	if st, msg := c.unary(t, envdwire.FsMove, &envdwire.MoveRequest{Source: "/tmp/made", Destination: "/tmp/new/moved"}, &er); st != 200 || er.Entry.Path != "/tmp/new/moved" {
		t.Fatalf("move: %d %s %+v", st, msg, er.Entry)
	}
	if st, msg := c.unary(t, envdwire.FsRemove, &envdwire.PathRequest{Path: "/tmp/d"}, nil); st != 200 {
		t.Fatalf("remove: %d %s", st, msg)
	}
	if out := c.sh(t, "ls /tmp/new; ls /tmp/new/dir; test -e /tmp/d || echo gone"); out != "dir\nmoved\ngone\n" {
		t.Fatalf("after make dir, move, remove: %q", out)
	}
	if st, _ := c.unary(t, envdwire.FsRemove, &envdwire.PathRequest{Path: "/tmp/d"}, nil); st != 404 {
		t.Fatalf("remove a missing path: %d", st)
	}

	// Signed URLs name no sandbox and carry no token.
	anon := &envdClient{url: h.url}
	exp := time.Now().Add(time.Hour).Unix()
	sig := signature("/tmp/new/moved", "read", "user", sb.EnvdAccessToken, exp)
	signed := func(sig string, exp int64) string {
		return fmt.Sprintf("path=%s&username=user&signature=%s&signature_expiration=%d", url.QueryEscape("/tmp/new/moved"), url.QueryEscape(sig), exp)
	}
	if st, body := anon.files(t, "GET", signed(sig, exp), nil, nil); st != 200 || body != "made" {
		t.Fatalf("signed download: %d %q", st, body)
	}
	if st, _ := anon.files(t, "GET", signed(sig+"x", exp), nil, nil); st != 401 {
		t.Fatalf("bad signature: %d", st)
	}
	past := time.Now().Add(-time.Minute).Unix()
	if st, _ := anon.files(t, "GET", signed(signature("/tmp/new/moved", "read", "user", sb.EnvdAccessToken, past), past), nil, nil); st != 401 {
		t.Fatalf("expired signature: %d", st)
	}
	if st, _ := anon.files(t, "GET", q("/tmp/new/moved"), nil, nil); st != 401 {
		t.Fatalf("no signature, no token: %d", st)
	}
	wsig := signature("/tmp/up", "write", "user", sb.EnvdAccessToken, 0)
	if st, body := anon.files(t, "POST", "path=%2Ftmp%2Fup&username=user&signature="+url.QueryEscape(wsig), strings.NewReader("up"),
		map[string]string{"Content-Type": "application/octet-stream"}); st != 200 {
		t.Fatalf("signed upload: %d %s", st, body)
	}
	if st, _ := anon.files(t, "GET", "path=%2Ftmp%2Fup&username=user&signature="+url.QueryEscape(wsig), nil, nil); st != 401 {
		t.Fatalf("a write signature used to read: %d", st)
	}
}

// TestWatchDir: a watch sees what a command does in the directory (and,
// recursive, below it), then ends when its client leaves.
func TestWatchDir(t *testing.T) {
	h := newHarness(t)
	c := h.envd(h.create(t, nil))
	c.sh(t, "mkdir -p /tmp/w")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, _ := jsonMarshal(&envdwire.WatchDirRequest{Path: "/tmp/w", Recursive: true})
	resp := c.rawStream(ctx, t, envdwire.FsWatch, b)
	defer resp.Body.Close()
	msgs := make(chan string, 100)
	go readEnvelopes(resp.Body, msgs)
	if m := <-msgs; m != `{"start":{}}` {
		t.Fatalf("first message %s", m)
	}
	c.sh(t, "mkdir /tmp/w/sub")
	// The new directory is watched once its create event is out; a file
	// made before that could be missed, so wait for it first.
	for m := range msgs {
		if m == `{"filesystem":{"name":"sub","type":"EVENT_TYPE_CREATE"}}` {
			break
		}
	}
	c.sh(t, "echo x > /tmp/w/sub/f; rm /tmp/w/sub/f")
	want := map[string]bool{
		`{"filesystem":{"name":"sub/f","type":"EVENT_TYPE_CREATE"}}`: false,
		`{"filesystem":{"name":"sub/f","type":"EVENT_TYPE_REMOVE"}}`: false,
	}
	deadline := time.After(2 * time.Minute)
	for left := len(want); left > 0; {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("stream ended; still waiting for %v", want)
			}
			if done, ok := want[m]; ok && !done {
				want[m] = true
				left--
			}
		case <-deadline:
			t.Fatalf("events missing after 2 minutes: %v", want)
		}
	}
}
