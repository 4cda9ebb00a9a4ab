package api

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/errdefs"
	fakeexec "github.com/esf-dev/esf/executor/fake"
	"github.com/esf-dev/esf/fabric"
	fakemounter "github.com/esf-dev/esf/mounter/fake"
)

// syncBuffer collects the server's logs across goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// harness is a real daemon in process: a Fabric on a temp state dir served
// on a temp unix socket.
type harness struct {
	dir    string
	f      *fabric.Fabric
	socket string
	client *client.Client
	logs   *syncBuffer
	srv    *Server
	stop   context.CancelFunc
	done   chan error
}

// onFakes is a newHarness tweak for tests of the API's logic: the fabric
// runs on the fake mounter and executor (plain directories, host
// processes), so the test needs no root, FUSE, overlayfs or runc.
func onFakes(o *fabric.Options) {
	o.Mounter = fakemounter.New()
	o.Executor = fakeexec.New()
}

func newHarness(t *testing.T, grace time.Duration, tweak ...func(*fabric.Options)) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{dir: dir, socket: filepath.Join(dir, "esfd.sock"), logs: &syncBuffer{}, done: make(chan error, 1)}
	log := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := fabric.Options{StateDir: filepath.Join(dir, "state"), Logger: log}
	for _, tw := range tweak {
		tw(&opts)
	}
	var err error
	h.f, err = fabric.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = NewServer(h.f, ServerOptions{Logger: log})
	client, cancel, done := serveTest(t, h.srv, h.socket, grace)
	h.stop = cancel
	go func() { h.done <- <-done }()
	h.client = client
	t.Cleanup(func() {
		h.client.Close()
		cancel()
		if err := <-h.done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		h.done <- nil // for a second reader
		// Attempts and the in-process projection must not outlive the test.
		if err := h.f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		h.f.Close()
	})
	return h
}

// raw sends a request without the Client, to see statuses and headers.
func (h *harness) raw(t *testing.T, method, path, contentType string, hdr map[string]string, body io.Reader) *http.Response {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", h.socket)
		},
	}}
	req, err := http.NewRequest(method, "http://esfd"+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close(); hc.CloseIdleConnections() })
	return resp
}

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestListen(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "esfd.sock")
	ln, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want socket 0600", fi.Mode())
	}
	if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 1 {
		t.Fatalf("temp dir left next to the socket: %v", ents)
	}
	// A live socket is not taken over.
	if _, err := Listen(p); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Listen on a live socket: %v", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket not removed on Close: %v", err)
	}

	// A stale socket (nobody accepts) is replaced.
	stale, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	ln, err = Listen(p)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	ln.Close()

	// Anything else at the path is left alone.
	if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(p); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Listen over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "data" {
		t.Fatal("regular file clobbered")
	}

	if _, err := Listen(filepath.Join(dir, strings.Repeat("x", 120))); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Listen on an over-long path: %v", err)
	}
}

func TestRoundTripThroughClient(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	writeTree(t, src, map[string]string{"a.txt": "alpha", "d/b.txt": "beta", "d/e/c.txt": strings.Repeat("c", 100000)})

	st, err := h.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Objects != 0 || st.StateDir != filepath.Join(h.dir, "state") || st.Version == "" {
		t.Fatalf("status of an empty daemon: %+v", st)
	}

	imp, err := h.client.Import(ctx, src, client.CallOptions{IdempotencyKey: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	if imp.Files != 3 || imp.Dirs != 3 || imp.NewObjects != 6 || imp.Skipped == nil {
		t.Fatalf("import: %+v", imp)
	}
	st, err = h.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Objects != imp.NewObjects || st.Bytes != imp.NewBytes {
		t.Fatalf("status after import %+v, import %+v", st, imp)
	}

	// Stream the root out as a tar, and back in: same root, nothing new.
	var buf bytes.Buffer
	res, err := h.client.ExportTar(ctx, imp.RootID.String(), &buf)
	if err != nil {
		t.Fatal(err)
	}
	if res.RootID != imp.RootID.String() || res.Bytes != int64(buf.Len()) {
		t.Fatalf("tar export %+v, %d bytes received", res, buf.Len())
	}
	back, err := h.client.ImportTar(ctx, bytes.NewReader(buf.Bytes()), client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if back.RootID != imp.RootID || back.NewObjects != 0 {
		t.Fatalf("tar re-import %+v, want root %s and no new objects", back, imp.RootID)
	}

	dest := filepath.Join(t.TempDir(), "out")
	exp, err := h.client.Export(ctx, imp.RootID.String(), dest, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if exp.Files != 3 || exp.To != dest || exp.RootID != imp.RootID {
		t.Fatalf("export: %+v", exp)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "d/e/c.txt")); err != nil || len(b) != 100000 {
		t.Fatalf("exported file: %d bytes, %v", len(b), err)
	}

	fsck, err := h.client.Fsck(ctx, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fsck.Checked != st.Objects || fsck.Bad == nil || len(fsck.Bad) != 0 {
		t.Fatalf("fsck: %+v, want %d checked and none bad", fsck, st.Objects)
	}
}

func TestErrorResponses(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	unknown := cas.Sum([]byte("nothing")).String()
	tests := []struct {
		name, method, path, ctype string
		hdr                       map[string]string
		body                      string
		status                    int
		code                      errdefs.Code
	}{
		{"unknown endpoint", "GET", "/v1/nope", "", nil, "", 404, errdefs.CodeNotFound},
		{"wrong method", "DELETE", "/v1/status", "", nil, "", 404, errdefs.CodeNotFound},
		{"unknown field", "POST", "/v1/import", v1.MediaJSON, nil, `{"src":"/x"}`, 400, errdefs.CodeInvalidArgument},
		{"relative source", "POST", "/v1/import", v1.MediaJSON, nil, `{"source":"x"}`, 400, errdefs.CodeInvalidArgument},
		{"missing source", "POST", "/v1/import", v1.MediaJSON, nil, `{"source":"/nonexistent/esf"}`, 404, errdefs.CodeNotFound},
		{"bad media type", "POST", "/v1/import", "text/plain", nil, `hello`, 400, errdefs.CodeInvalidArgument},
		{"garbage tar", "POST", "/v1/import", v1.MediaTar, nil, strings.Repeat("garbage!", 200), 400, errdefs.CodeInvalidArgument},
		{"bad idempotency key", "POST", "/v1/fsck", "", map[string]string{v1.HeaderIdempotencyKey: "a b"}, "", 400, errdefs.CodeInvalidArgument},
		{"export unknown id", "POST", "/v1/export", v1.MediaJSON, nil, `{"id":"` + unknown + `","to":"/tmp/x"}`, 404, errdefs.CodeNotFound},
		{"export malformed id", "POST", "/v1/export", v1.MediaJSON, nil, `{"id":"xyz","to":"/tmp/x"}`, 400, errdefs.CodeInvalidArgument},
		{"export no id", "POST", "/v1/export", v1.MediaJSON, nil, `{"to":"/tmp/x"}`, 400, errdefs.CodeInvalidArgument},
		{"tar unknown id", "GET", "/v1/export/" + unknown + ".tar", "", nil, "", 404, errdefs.CodeNotFound},
		{"tar malformed id", "GET", "/v1/export/zz.tar", "", nil, "", 400, errdefs.CodeInvalidArgument},
		{"tar wrong suffix", "GET", "/v1/export/" + unknown + ".zip", "", nil, "", 400, errdefs.CodeInvalidArgument},
		{"fsck unknown option", "POST", "/v1/fsck", v1.MediaJSON, nil, `{"repair":true}`, 400, errdefs.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body)
			}
			resp := h.raw(t, tt.method, tt.path, tt.ctype, tt.hdr, body)
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.status)
			}
			if ct := resp.Header.Get("Content-Type"); ct != v1.MediaJSON {
				t.Errorf("Content-Type %q", ct)
			}
			var e errdefs.Error
			dec := json.NewDecoder(resp.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&e); err != nil {
				t.Fatalf("error body: %v", err)
			}
			if e.Code != tt.code || e.Message == "" {
				t.Errorf("error %+v, want code %s", e, tt.code)
			}
		})
	}
}

func TestClientErrorsKeepTheirClass(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	_, err := h.client.Export(ctx, cas.Sum([]byte("x")).String(), "/tmp/esf-never", client.CallOptions{})
	var e *errdefs.Error
	if !errors.As(err, &e) || !errors.Is(err, errdefs.ErrNotFound) || e.Code != errdefs.CodeNotFound {
		t.Fatalf("export of unknown id: %#v", err)
	}
	var buf bytes.Buffer
	if _, err := h.client.ExportTar(ctx, "nope", &buf); !errors.Is(err, errdefs.ErrInvalidArgument) || buf.Len() != 0 {
		t.Fatalf("tar export of a malformed id: %v (%d bytes)", err, buf.Len())
	}

	// A large invalid stream: the daemon answers before it has read it all,
	// and the client reports the daemon's answer, not a broken pipe.
	junk := make([]byte, 16<<20)
	rand.Read(junk)
	if _, err := h.client.ImportTar(ctx, bytes.NewReader(junk), client.CallOptions{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("import of 16 MiB of junk: %v, want invalid_argument", err)
	}

	// A failing reader is the caller's error, with the caller's code.
	bad := io.MultiReader(strings.NewReader("abc"), errReader{&errdefs.Error{Code: errdefs.CodeNotFound, Message: "gone"}})
	if _, err := h.client.ImportTar(ctx, bad, client.CallOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("import from a failing reader: %v", err)
	}

	down := client.NewClient(filepath.Join(t.TempDir(), "none.sock"))
	if _, err := down.Status(ctx); !errors.As(err, &e) || e.Code != errdefs.CodeUnavailable {
		t.Fatalf("status from a missing daemon: %#v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := h.client.Status(cctx); !errors.As(err, &e) || e.Code != errdefs.CodeDeadlineExceeded {
		t.Fatalf("status with a cancelled context: %#v", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// corruptBlob flips a byte of the stored object id.
func corruptBlob(t *testing.T, h *harness, id cas.ID) {
	t.Helper()
	st, err := local.Open(filepath.Join(h.dir, "state", "cas"), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := st.Path(id)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestExportTarFailsMidStream proves that a tar stream that breaks after
// its first byte is never taken as complete: the trailers say error, and
// the client returns the daemon's code.
func TestExportTarFailsMidStream(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	late := strings.Repeat("z", 3<<20) // sorts last, several buffers long
	writeTree(t, src, map[string]string{"a.txt": strings.Repeat("a", 70000), "z.bin": late})
	imp, err := h.client.Import(ctx, src, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}

	resp := h.raw(t, "GET", "/v1/export/"+imp.RootID.String()+".tar", "", nil, nil)
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || resp.Trailer.Get(v1.TrailerStatus) != "ok" {
		t.Fatalf("intact export: %d, %v, trailers %v", resp.StatusCode, err, resp.Trailer)
	}
	names := tarNames(t, body)
	if strings.Join(names, ",") != "./,./a.txt,./z.bin" {
		t.Fatalf("tar members %v", names)
	}

	corruptBlob(t, h, cas.Sum([]byte(late)))
	resp = h.raw(t, "GET", "/v1/export/"+imp.RootID.String()+".tar", "", nil, nil)
	body, err = io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("corrupt export: %d, %v", resp.StatusCode, err)
	}
	if len(body) == 0 {
		t.Fatal("the stream failed before its first byte; this test wants it to fail mid-stream")
	}
	if resp.Trailer.Get(v1.TrailerStatus) != "error" {
		t.Fatalf("trailers %v, want %s: error", resp.Trailer, v1.TrailerStatus)
	}
	var e errdefs.Error
	if err := json.Unmarshal([]byte(resp.Trailer.Get(v1.TrailerError)), &e); err != nil || e.Code != errdefs.CodeCorrupt {
		t.Fatalf("%s trailer %q: %+v, %v", v1.TrailerError, resp.Trailer.Get(v1.TrailerError), e, err)
	}
	// Even a reader that ignores the trailers cannot take the corrupt member
	// as complete: it is cut short.
	tr := tar.NewReader(bytes.NewReader(body))
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("tar stops before z.bin: %v", err)
		}
		if hdr.Name != "./z.bin" {
			continue
		}
		if n, err := io.Copy(io.Discard, tr); err != io.ErrUnexpectedEOF {
			t.Fatalf("corrupt member read whole: %d bytes, %v", n, err)
		}
		break
	}

	var buf bytes.Buffer
	if _, err := h.client.ExportTar(ctx, imp.RootID.String(), &buf); !errors.Is(err, errdefs.ErrCorrupt) {
		t.Fatalf("client tar export of corrupt content: %v, want corrupt", err)
	}
	if !strings.Contains(h.logs.String(), `"code":"corrupt"`) {
		t.Error("the failure is not in the daemon log")
	}
}

func tarNames(t *testing.T, b []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatalf("tar: %v", err)
		}
		names = append(names, hdr.Name)
	}
}

func TestTraceAndIdempotencyReachTheRequest(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	resp := h.raw(t, "POST", "/v1/fsck", "", map[string]string{
		v1.HeaderTraceparent:    "00-" + trace + "-00f067aa0ba902b7-01",
		v1.HeaderIdempotencyKey: "retry-me-42",
	}, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	tp := resp.Header.Get(v1.HeaderTraceparent)
	got, flags, ok := splitTraceparent(tp)
	if !ok || got != trace || flags != "01" || strings.Contains(tp, "00f067aa0ba902b7") {
		t.Fatalf("response traceparent %q: want trace %s with a new span", tp, trace)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, `"trace_id":"`+trace+`"`) || !strings.Contains(logs, `"idempotency_key":"retry-me-42"`) {
		t.Fatalf("request log lacks trace or key:\n%s", logs)
	}

	// A read is not a mutation: its key (if any) is not recorded.
	resp = h.raw(t, "GET", "/v1/status", "", map[string]string{v1.HeaderIdempotencyKey: "read-key"}, nil)
	if resp.StatusCode != 200 || strings.Contains(h.logs.String(), "read-key") {
		t.Fatalf("status with a key: %d", resp.StatusCode)
	}
}

// TestGracefulShutdown starts a streamed import, asks the server to stop
// while it is in flight, and checks that the import still completes, that
// new connections are refused and that the socket file goes away.
func TestGracefulShutdown(t *testing.T) {
	h := newHarness(t, 30*time.Second)
	ctx := context.Background()

	pr, pw := io.Pipe()
	type result struct {
		res *v1.ImportResponse
		err error
	}
	resc := make(chan result, 1)
	go func() {
		res, err := h.client.ImportTar(ctx, pr, client.CallOptions{})
		resc <- result{res, err}
	}()
	tw := tar.NewWriter(pw)
	write := func(name, data string) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	// More than the socket buffers hold: once written, the handler is
	// running and reading it.
	write("first", strings.Repeat("1", 4<<20))

	h.stop()
	waitFor(t, func() bool {
		_, err := os.Lstat(h.socket)
		return errors.Is(err, fs.ErrNotExist)
	})
	if _, err := client.NewClient(h.socket).Status(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("new request during shutdown: %v, want unavailable", err)
	}
	select {
	case r := <-resc:
		t.Fatalf("in-flight import ended early: %+v, %v", r.res, r.err)
	case err := <-h.done:
		t.Fatalf("Serve returned with a request in flight: %v", err)
	case <-time.After(100 * time.Millisecond):
	}

	write("second", "2")
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	r := <-resc
	if r.err != nil || r.res.Files != 2 || r.res.Bytes != 4<<20+1 {
		t.Fatalf("in-flight import: %+v, %v", r.res, r.err)
	}
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
		h.done <- nil
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return after the last request")
	}
}

// TestShutdownGraceExpires: a request still running when the grace period
// ends is cancelled, and Serve returns.
func TestShutdownGraceExpires(t *testing.T) {
	h := newHarness(t, 200*time.Millisecond)
	pr, pw := io.Pipe()
	defer pw.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := h.client.ImportTar(context.Background(), pr, client.CallOptions{})
		errc <- err
	}()
	if _, err := pw.Write(make([]byte, 512)); err != nil { // a request is in flight
		t.Fatal(err)
	}
	h.stop()
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("Serve after the grace period: %v", err)
		}
		if n := h.srv.active.Load(); n != 0 {
			t.Fatalf("Serve returned with %d handlers running", n)
		}
		h.done <- nil
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return after its grace period")
	}
	pw.CloseWithError(fmt.Errorf("test over"))
	if err := <-errc; err == nil {
		t.Fatal("an import cut off by shutdown succeeded")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in a minute")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
