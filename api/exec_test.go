package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/testenv"
)

// TestExecEndpointErrors: what fails before the command starts is a plain
// JSON error; the plain form refuses stdin and tty, which need the
// interactive one.
func TestExecEndpointErrors(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	_, err := h.client.Exec(ctx, v1.ExecRequest{AttemptID: "att_0000000000000000000000000a", Args: []string{"true"}}, nil, nil)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("exec in an unknown attempt: %v", err)
	}
	_, err = h.client.Exec(ctx, v1.ExecRequest{AttemptID: "nope", Args: []string{"true"}}, nil, nil)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("exec with a malformed attempt id: %v", err)
	}
	for body, code := range map[string]errdefs.Code{
		`{"attempt_id":"att_1","args":["sh"],"stdin":true}`: errdefs.CodeUnsupported,
		`{"attempt_id":"att_1","args":["sh"],"tty":true}`:   errdefs.CodeUnsupported,
		`{"attempt_id":"att_1"}`:                            errdefs.CodeInvalidArgument,
		`{"attempt_id":"att_1","args":["sh"],"x":1}`:        errdefs.CodeInvalidArgument,
	} {
		status, b, _ := h.rawJSON(t, "/v1/exec", "", body)
		if got := errorCode(t, b); got != code || status != HTTPStatus(code) {
			t.Errorf("exec %s: %d %s, want %s", body, status, b, code)
		}
	}
}

// TestExecHandlerNoStreamOnError: a
// request whose decode fails never starts a stream.
func TestExecHandlerNoStreamOnError(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/v1/exec", strings.NewReader(`{"attempt_id":"att_1","args":["x"],"tty":true}`))
	h.srv.ServeHTTP(rec, req)
	if rec.Code != http.StatusNotImplemented || rec.Header().Get("Content-Type") != v1.MediaJSON {
		t.Fatalf("%d %s: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
}

// runcAttempt serves a Fabric with a real runc executor and returns a
// client and a live runc attempt on a busybox root.
func runcAttempt(t *testing.T) (*client.Client, v1.AttemptView) {
	t.Helper()
	requireMounts(t)
	testenv.Require(t, runctest.Needs...)
	ctx := context.Background()
	dir := t.TempDir()
	initBin, err := runctest.BuildInit(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "esf-apitest"
	ex, err := runc.New(runc.Options{StateDir: filepath.Join(dir, "runc"), Init: initBin, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	f, err := fabric.Open(ctx, fabric.Options{StateDir: filepath.Join(dir, "state"), Executor: ex})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "esfd.sock")
	c, cancel, done := serveTest(t, NewServer(f, ServerOptions{Logger: slog.New(slog.DiscardHandler)}), sock, 5*time.Second)
	t.Cleanup(func() {
		c.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
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
	g, err := f.CreateGroup(ctx, fabric.CreateGroupRequest{RootID: imp.Root.String()})
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Activate(ctx, v1.ActivateRequest{NodeID: g.Node.NodeID, Executor: v1.ExecutorRunc}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c, *a
}

// TestExecIORunc: stdin and a terminal through the API into a real
// container: cat and wc -c see every byte and the end of stdin; a command
// that exits without reading to the end does not wait for it; the
// terminal has the asked size and follows resizes; cancelling kills.
func TestExecIORunc(t *testing.T) {
	c, a := runcAttempt(t)
	ctx := context.Background()
	run := func(t *testing.T, stdin io.Reader, args ...string) (string, string, int) {
		t.Helper()
		var out, errb bytes.Buffer
		res, err := c.ExecIO(ctx, v1.ExecRequest{AttemptID: a.AttemptID, Args: args}, client.ExecStreams{Stdin: stdin, Stdout: &out, Stderr: &errb})
		if err != nil {
			t.Fatalf("exec %v: %v (stderr %q)", args, err, errb.String())
		}
		return out.String(), errb.String(), res.ExitCode
	}
	t.Run("cat", func(t *testing.T) {
		if out, _, code := run(t, strings.NewReader("hello\n"), "cat"); out != "hello\n" || code != 0 {
			t.Fatalf("cat: %q %d", out, code)
		}
		if out, _, code := run(t, strings.NewReader(""), "sh", "-c", "cat; echo end"); out != "end\n" || code != 0 {
			t.Fatalf("cat of an empty stdin: %q %d", out, code)
		}
	})
	t.Run("wc", func(t *testing.T) {
		in := make([]byte, 4*v1.StdinWindow+7)
		rand.Read(in)
		out, _, code := run(t, bytes.NewReader(in), "sh", "-c", "wc -c; exit 5")
		if strings.TrimSpace(out) != fmt.Sprint(len(in)) || code != 5 {
			t.Fatalf("wc -c of %d bytes: %q, exit %d", len(in), out, code)
		}
	})
	t.Run("exit before the end of stdin", func(t *testing.T) {
		inR, inW := io.Pipe()
		defer inW.Close()
		go io.WriteString(inW, "abc\n")
		// stdin never ends: an exec that waited for its end would never
		// return. The bound is one a loaded machine cannot reach.
		type result struct {
			res v1.ExecResult
			err error
		}
		var out bytes.Buffer
		done := make(chan result, 1)
		go func() {
			res, err := c.ExecIO(ctx, v1.ExecRequest{AttemptID: a.AttemptID, Args: []string{"sh", "-c", "read x; echo got $x; exit 4"}},
				client.ExecStreams{Stdin: inR, Stdout: &out})
			done <- result{res, err}
		}()
		select {
		case r := <-done:
			if r.err != nil || out.String() != "got abc\n" || r.res.ExitCode != 4 {
				t.Fatalf("got %q, exit %d, %v", out.String(), r.res.ExitCode, r.err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("the exec waited for the end of a stdin its command no longer read")
		}
	})
	t.Run("tty", func(t *testing.T) {
		inR, inW := io.Pipe()
		defer inW.Close()
		sizes := make(chan [2]uint16, 1)
		out := &syncBuffer{}
		type result struct {
			res v1.ExecResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			// A shell without line editing, whose terminal queries this
			// test would not answer.
			res, err := c.ExecIO(ctx, v1.ExecRequest{AttemptID: a.AttemptID, Args: []string{"sh", "-c", `while read -r l; do eval "$l"; done`},
				TTY: true, Rows: 30, Cols: 90},
				client.ExecStreams{Stdin: inR, Stdout: out, Resize: sizes})
			done <- result{res, err}
		}()
		io.WriteString(inW, "tty; stty size\n")
		waitOutput(t, out, "30 90\r\n")
		if !strings.Contains(out.String(), "/dev/pts/") {
			t.Fatalf("not a terminal: %q", out.String())
		}
		sizes <- [2]uint16{40, 100}
		// The resize frame and the next line travel apart: ask until the
		// new size shows.
		deadline := time.Now().Add(time.Minute)
		for !strings.Contains(out.String(), "40 100\r\n") && time.Now().Before(deadline) {
			io.WriteString(inW, "stty size\n")
			time.Sleep(100 * time.Millisecond)
		}
		waitOutput(t, out, "40 100\r\n")
		io.WriteString(inW, "exit 7\n")
		r := <-done
		if r.err != nil || r.res.ExitCode != 7 {
			t.Fatalf("interactive shell: %+v %v; output %q", r.res, r.err, out.String())
		}
	})
	t.Run("tty stdin end", func(t *testing.T) {
		var out bytes.Buffer
		res, err := c.ExecIO(ctx, v1.ExecRequest{AttemptID: a.AttemptID, Args: []string{"sh", "-c", "cat; echo end"}, TTY: true},
			client.ExecStreams{Stdin: strings.NewReader("hello\n"), Stdout: &out})
		if err != nil || res.ExitCode != 0 || !strings.HasSuffix(out.String(), "hello\r\nend\r\n") {
			t.Fatalf("cat on a terminal whose input ends: %+v %v %q", res, err, out.String())
		}
	})
	t.Run("cancel kills", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		inR, inW := io.Pipe()
		defer inW.Close()
		errc := make(chan error, 1)
		out := &syncBuffer{}
		go func() {
			_, err := c.ExecIO(cctx, v1.ExecRequest{AttemptID: a.AttemptID, Args: []string{"sh", "-c", "echo started; exec sleep 1000"}},
				client.ExecStreams{Stdin: inR, Stdout: out})
			errc <- err
		}()
		waitOutput(t, out, "started\n")
		if ps, _, _ := run(t, nil, "ps", "-o", "args"); !strings.Contains(ps, "sleep 1000") {
			t.Fatalf("ps does not show the command:\n%s", ps)
		}
		cancel()
		if err := <-errc; errdefs.CodeOf(err) != errdefs.CodeDeadlineExceeded {
			t.Fatalf("cancelled exec: %v", err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			ps, _, _ := run(t, nil, "ps", "-o", "args")
			if !strings.Contains(ps, "sleep 1000") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the command outlived its cancelled client:\n%s", ps)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}
