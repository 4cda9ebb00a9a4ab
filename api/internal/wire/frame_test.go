package wire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

// TestFrameRoundTrip: output written concurrently to both streams, in
// pieces larger than a frame, arrives whole and in order per stream, and
// the exit frame ends the read.
func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	flushes := 0
	fw := NewWriter(&buf, func() error { flushes++; return nil })
	big := bytes.Repeat([]byte("0123456789abcdef"), (3*MaxPayload)/16+7)
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
		w := fw.Stream(v1.FrameStdout)
		for i := range 50 {
			fmt.Fprintf(w, "out %d\n", i)
		}
		if n, err := w.Write(big); n != len(big) || err != nil {
			t.Errorf("big write: %d, %v", n, err)
		}
	}()
	go func() {
		defer wg.Done()
		w := fw.Stream(v1.FrameStderr)
		for i := range 50 {
			fmt.Fprintf(w, "err %d\n", i)
		}
	}()
	wg.Wait()
	want := v1.ExecResult{ExitCode: 137, Millis: 5}
	p, _ := json.Marshal(want)
	if err := fw.Frame(v1.FrameExit, p); err != nil {
		t.Fatal(err)
	}
	if flushes != 100+4+1 {
		t.Errorf("%d flushes, want one per frame (105)", flushes)
	}
	var out, errb bytes.Buffer
	got, err := ReadFrames(bytes.NewReader(buf.Bytes()), &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), wantOut.Bytes()) || errb.String() != wantErr.String() {
		t.Fatalf("streams differ: stdout %d bytes (want %d), stderr %q", out.Len(), wantOut.Len(), errb.String())
	}
	res, err := ExitPayload(got)
	if err != nil || res != want {
		t.Fatalf("exit: %+v, %v", res, err)
	}

	// Every prefix that stops short of the exit frame is a truncated stream.
	for _, cut := range []int{0, 3, 5, buf.Len() - len(p) - 1, buf.Len() - 1} {
		_, err := ReadFrames(bytes.NewReader(buf.Bytes()[:cut]), io.Discard, io.Discard)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("stream cut at %d: %v", cut, err)
		}
	}
	for _, bad := range [][]byte{{9, 0, 0, 0, 0}, {1, 0xff, 0, 0, 0}} {
		if _, err := ReadFrames(bytes.NewReader(bad), io.Discard, io.Discard); !errors.Is(err, ErrBadStream) {
			t.Errorf("frame % x: %v", bad, err)
		}
	}
}

func TestExitPayloadError(t *testing.T) {
	p, _ := json.Marshal(errdefs.Wire(fmt.Errorf("exec: killed: %w", context.DeadlineExceeded)))
	if _, err := ExitPayload(p); errdefs.CodeOf(err) != errdefs.CodeDeadlineExceeded {
		t.Fatalf("timeout exit frame: %v", err)
	}
	if _, err := ExitPayload([]byte("{")); errdefs.CodeOf(err) != errdefs.CodeInternal {
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
	fw := NewWriter(&failingWriter{n: 2}, nil)
	w := fw.Stream(v1.FrameStdout)
	if _, err := w.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("b")); err == nil {
		t.Fatal("write after the client left succeeded")
	}
	if err := fw.Frame(v1.FrameExit, []byte("{}")); err == nil {
		t.Fatal("a failed stream took another frame")
	}
}
