package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// TestFrameRoundTrip: output written concurrently to both streams, in
// pieces larger than a frame, arrives whole and in order per stream, and
// the exit frame ends the read.
func TestFrameRoundTrip(t *testing.T) {
	var wire bytes.Buffer
	flushes := 0
	fw := &frameWriter{w: &wire, flush: func() error { flushes++; return nil }}
	big := bytes.Repeat([]byte("0123456789abcdef"), (3*maxFramePayload)/16+7)
	var wg sync.WaitGroup
	var wantOut, wantErr bytes.Buffer
	for i := range 50 {
		fmt.Fprintf(&wantOut, "out %d\n", i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	wantOut.Write(big)
	wg.Add(2)
	go func() {
		defer wg.Done()
		w := fw.stream(FrameStdout)
		for i := range 50 {
			fmt.Fprintf(w, "out %d\n", i)
		}
		if n, err := w.Write(big); n != len(big) || err != nil {
			t.Errorf("big write: %d, %v", n, err)
		}
	}()
	go func() {
		defer wg.Done()
		w := fw.stream(FrameStderr)
		for i := range 50 {
			fmt.Fprintf(w, "err %d\n", i)
		}
	}()
	wg.Wait()
	want := fabric.ExecResult{ExitCode: 137, Millis: 5}
	p, _ := json.Marshal(want)
	if err := fw.frame(FrameExit, p); err != nil {
		t.Fatal(err)
	}
	if flushes != 100+4+1 {
		t.Errorf("%d flushes, want one per frame (105)", flushes)
	}
	var out, errb bytes.Buffer
	got, err := readFrames(bytes.NewReader(wire.Bytes()), &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), wantOut.Bytes()) || errb.String() != wantErr.String() {
		t.Fatalf("streams differ: stdout %d bytes (want %d), stderr %q", out.Len(), wantOut.Len(), errb.String())
	}
	res, err := exitPayload(got)
	if err != nil || res != want {
		t.Fatalf("exit: %+v, %v", res, err)
	}

	// Every prefix that stops short of the exit frame is a truncated stream.
	for _, cut := range []int{0, 3, 5, wire.Len() - len(p) - 1, wire.Len() - 1} {
		_, err := readFrames(bytes.NewReader(wire.Bytes()[:cut]), io.Discard, io.Discard)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("stream cut at %d: %v", cut, err)
		}
	}
	for _, bad := range [][]byte{{9, 0, 0, 0, 0}, {1, 0xff, 0, 0, 0}} {
		if _, err := readFrames(bytes.NewReader(bad), io.Discard, io.Discard); !errors.Is(err, errBadStream) {
			t.Errorf("frame % x: %v", bad, err)
		}
	}
}

func TestExitPayloadError(t *testing.T) {
	p, _ := json.Marshal(errdefs.Wire(fmt.Errorf("exec: killed: %w", context.DeadlineExceeded)))
	if _, err := exitPayload(p); errdefs.CodeOf(err) != errdefs.CodeDeadlineExceeded {
		t.Fatalf("timeout exit frame: %v", err)
	}
	if _, err := exitPayload([]byte("{")); errdefs.CodeOf(err) != errdefs.CodeInternal {
		t.Fatalf("garbage exit frame: %v", err)
	}
}

// failingWriter fails after n writes, as a client that went away does.
type failingWriter struct{ n int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.n == 0 {
		return 0, errors.New("broken pipe")
	}
	f.n--
	return len(p), nil
}

func TestFrameWriterSticky(t *testing.T) {
	fw := &frameWriter{w: &failingWriter{n: 2}}
	w := fw.stream(FrameStdout)
	if _, err := w.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("b")); err == nil {
		t.Fatal("write after the client left succeeded")
	}
	if err := fw.frame(FrameExit, []byte("{}")); err == nil {
		t.Fatal("a failed stream took another frame")
	}
}

// TestExecEndpointErrors: what fails before the command starts is a plain
// JSON error; stdin and tty need a two-way connection and are refused.
func TestExecEndpointErrors(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	_, err := h.client.Exec(ctx, fabric.ExecRequest{AttemptID: "att_0000000000000000000000000a", Args: []string{"true"}}, nil, nil)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("exec in an unknown attempt: %v", err)
	}
	_, err = h.client.Exec(ctx, fabric.ExecRequest{AttemptID: "nope", Args: []string{"true"}}, nil, nil)
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
	if rec.Code != http.StatusNotImplemented || rec.Header().Get("Content-Type") != MediaJSON {
		t.Fatalf("%d %s: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
}
