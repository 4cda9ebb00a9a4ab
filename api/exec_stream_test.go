package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// fakeExec stands in for fabric.Exec: commands chosen by Args[0], stdin
// through a pipe as the executors give it, and a record of what happened.
type fakeExec struct {
	killed chan string             // Args[0] of each command killed by its context
	forms  chan string             // the Content-Type each request came with
	eofs   atomic.Int64            // stdins that reached their end
	sizes  chan [2]uint16          // resizes, in order
	start  chan fabric.ExecRequest // each command as it starts
}

func newFakeExec() *fakeExec {
	return &fakeExec{killed: make(chan string, 16), forms: make(chan string, 64), sizes: make(chan [2]uint16, 16),
		start: make(chan fabric.ExecRequest, 16)}
}

func (f *fakeExec) run(ctx context.Context, req fabric.ExecRequest, st fabric.ExecStreams) (fabric.ExecResult, error) {
	switch req.Args[0] {
	case "missing":
		return fabric.ExecResult{}, fmt.Errorf("exec: attempt att_x: %w", errdefs.ErrNotFound)
	}
	var in io.Reader = strings.NewReader("")
	var stdin io.WriteCloser
	if req.Stdin {
		pr, pw := io.Pipe()
		defer pr.Close() // as the executors do: writes after the end fail
		stop := context.AfterFunc(ctx, func() { pr.CloseWithError(ctx.Err()) })
		defer stop()
		in, stdin = pr, pw
	}
	var resize func(rows, cols uint16) error
	if req.TTY {
		resize = func(rows, cols uint16) error {
			f.sizes <- [2]uint16{rows, cols}
			fmt.Fprintf(st.Stdout, "size %d %d\n", rows, cols)
			return nil
		}
	}
	if st.Started != nil { // the plain form gives none
		st.Started(stdin, resize)
	}
	f.start <- req
	code := 0
	switch req.Args[0] {
	case "cat":
		if _, err := io.Copy(st.Stdout, in); err == nil {
			f.eofs.Add(1)
		}
	case "wc":
		n, err := io.Copy(io.Discard, in)
		if err == nil {
			f.eofs.Add(1)
		}
		fmt.Fprintf(st.Stdout, "%d\n", n)
		fmt.Fprintf(st.Stderr, "counted\n")
	case "shell": // a line-driven command: "exit N" ends it
		fmt.Fprintf(st.Stdout, "tty %d %d\n", req.Rows, req.Cols)
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			if _, err := fmt.Sscanf(sc.Text(), "exit %d", &code); err == nil {
				break
			}
			fmt.Fprintf(st.Stdout, "> %s\n", sc.Text())
		}
	case "wait": // reads nothing, ends only when killed
		<-ctx.Done()
	case "echo":
		fmt.Fprintf(st.Stdout, "%s\n", strings.Join(req.Args[1:], " "))
		code = 3
	}
	if ctx.Err() != nil {
		f.killed <- req.Args[0]
		return fabric.ExecResult{ExitCode: 137}, fmt.Errorf("exec: killed: %w", ctx.Err())
	}
	return fabric.ExecResult{ExitCode: code}, nil
}

// fakeServer serves f's exec through the real request plumbing on a unix
// socket and returns a client of it.
func fakeServer(t *testing.T, f *fakeExec) *client.Client {
	t.Helper()
	c, stop, done := fakeServe(t, f, 5*time.Second)
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		noGoroutines(t, "api.(*session)", "client.sendSizes", "client.sendStdin", "api.serveInteractive")
	})
	return c
}

// fakeServe starts serving f's exec; stop begins the shutdown, whose
// result comes on done.
func fakeServe(t *testing.T, f *fakeExec, grace time.Duration) (*client.Client, context.CancelFunc, <-chan error) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "esfd.sock")
	s := &Server{log: slog.New(slog.DiscardHandler), mux: http.NewServeMux(), stopping: make(chan struct{})}
	s.handle("POST /v1/exec", true, func(w http.ResponseWriter, r *http.Request) error {
		f.forms <- wire.MediaType(r.Header.Get("Content-Type"))
		return serveExec(w, r, f.run)
	})
	c, cancel, done := serveTest(t, s, sock, grace)
	t.Cleanup(c.Close)
	return c, cancel, done
}

// TestExecIOShutdown: an interactive exec is an ordinary request to the
// server's shutdown: it gets the grace period, then is cancelled (the
// command killed), and Serve returns only once its handler did.
func TestExecIOShutdown(t *testing.T) {
	f := newFakeExec()
	c, stop, done := fakeServe(t, f, 300*time.Millisecond)
	inR, inW := io.Pipe()
	defer inW.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := c.ExecIO(context.Background(), v1.ExecRequest{AttemptID: "att_1", Args: []string{"wait"}}, client.ExecStreams{Stdin: inR})
		errc <- err
	}()
	<-f.start
	start := time.Now()
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("Serve returned after %v, within the grace period of a running exec", d)
	}
	select {
	case <-f.killed:
	default:
		t.Fatal("Serve returned with the command still running")
	}
	if err := <-errc; err == nil {
		t.Fatal("an exec cut short by shutdown succeeded")
	}
	inW.Close()
	noGoroutines(t, "api.(*session)", "api.sendStdin", "api.serveInteractive")
}

// noGoroutines fails if goroutines running any of fns are still there
// after a generous while (a loaded machine may be slow to run them to
// their end): every exec's goroutines end with it.
func noGoroutines(t *testing.T, fns ...string) {
	t.Helper()
	var stacks string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		left := ""
		for _, g := range strings.Split(stacks, "\n\n") {
			for _, fn := range fns {
				if strings.Contains(g, fn) {
					left += g + "\n\n"
				}
			}
		}
		if left == "" {
			return
		}
		stacks = left
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("goroutines outlived their exec:\n%s", stacks)
}

// TestExecIOStdinRoundTrip: stdin larger than the window arrives whole and
// in order, its end reaches the command, and both streams come back.
func TestExecIOStdinRoundTrip(t *testing.T) {
	f := newFakeExec()
	c := fakeServer(t, f)
	ctx := context.Background()
	in := make([]byte, 3*v1.StdinWindow+12345)
	rand.Read(in)
	for _, tc := range []struct {
		name  string
		stdin io.Reader
	}{
		{"bytes", bytes.NewReader(in)},
		{"one byte per read", &oneByteReader{r: bytes.NewReader(in[:5000])}},
		{"empty", strings.NewReader("")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, _ := io.ReadAll(tc.stdin)
			tc.stdin = bytes.NewReader(want)
			if tc.name == "one byte per read" {
				tc.stdin = &oneByteReader{r: bytes.NewReader(want)}
			}
			eofs := f.eofs.Load()
			var out bytes.Buffer
			res, err := c.ExecIO(ctx, v1.ExecRequest{AttemptID: "att_1", Args: []string{"cat"}}, client.ExecStreams{Stdin: tc.stdin, Stdout: &out})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("cat: %+v, %v", res, err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("cat returned %d bytes, sent %d", out.Len(), len(want))
			}
			if f.eofs.Load() != eofs+1 {
				t.Fatal("the command never saw the end of stdin")
			}
			if got := <-f.forms; got != v1.MediaExecStream {
				t.Fatalf("stdin went as %s", got)
			}
		})
	}
	var out, errb bytes.Buffer
	res, err := c.ExecIO(ctx, v1.ExecRequest{AttemptID: "att_1", Args: []string{"wc"}}, client.ExecStreams{Stdin: bytes.NewReader(in), Stdout: &out, Stderr: &errb})
	if err != nil || out.String() != fmt.Sprintf("%d\n", len(in)) || errb.String() != "counted\n" {
		t.Fatalf("wc: %+v %v: stdout %q stderr %q", res, err, out.String(), errb.String())
	}
	<-f.forms
	// Without stdin or terminal the plain form is used, as by Exec.
	out.Reset()
	res, err = c.Exec(ctx, v1.ExecRequest{AttemptID: "att_1", Args: []string{"echo", "plain"}}, &out, nil)
	if err != nil || res.ExitCode != 3 || out.String() != "plain\n" {
		t.Fatalf("plain exec: %+v %v %q", res, err, out.String())
	}
	if got := <-f.forms; got != v1.MediaJSON {
		t.Fatalf("a plain exec went as %s", got)
	}
}

type oneByteReader struct{ r io.Reader }

func (o *oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

// TestExecIOTerminal: the initial size is the request's, resizes arrive in
// order (one sent before the command ran too), and an interactive
// conversation streams both ways.
func TestExecIOTerminal(t *testing.T) {
	f := newFakeExec()
	c := fakeServer(t, f)
	inR, inW := io.Pipe()
	defer inW.Close()
	sizes := make(chan [2]uint16, 4)
	sizes <- [2]uint16{30, 90} // before the command runs
	out := &syncBuffer{}
	type result struct {
		res v1.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.ExecIO(context.Background(), v1.ExecRequest{AttemptID: "att_1", Args: []string{"shell"}, TTY: true, Rows: 24, Cols: 80},
			client.ExecStreams{Stdin: inR, Stdout: out, Resize: sizes})
		done <- result{res, err}
	}()
	waitOutput(t, out, "tty 24 80\n")
	if got := <-f.sizes; got != [2]uint16{30, 90} {
		t.Fatalf("first resize %v", got)
	}
	io.WriteString(inW, "hello\n")
	waitOutput(t, out, "> hello\n")
	sizes <- [2]uint16{50, 132}
	sizes <- [2]uint16{51, 133}
	for _, want := range [][2]uint16{{50, 132}, {51, 133}} {
		if got := <-f.sizes; got != want {
			t.Fatalf("resize %v, want %v", got, want)
		}
	}
	waitOutput(t, out, "size 51 133\n")
	io.WriteString(inW, "exit 7\n")
	r := <-done
	if r.err != nil || r.res.ExitCode != 7 {
		t.Fatalf("shell: %+v, %v", r.res, r.err)
	}
	// The caller's stdin is still open: the goroutine reading it ends at
	// its next Read, without touching the data.
	inW.Close()
	// Resize without a terminal is ignored; a terminal without stdin is
	// interactive too (its output is a terminal's).
	out = &syncBuffer{}
	res, err := c.ExecIO(context.Background(), v1.ExecRequest{AttemptID: "att_1", Args: []string{"shell"}, TTY: true, Rows: 5, Cols: 6},
		client.ExecStreams{Stdout: out})
	if err != nil || res.ExitCode != 0 || out.String() != "tty 5 6\n" {
		t.Fatalf("tty without stdin: %+v %v %q", res, err, out.String())
	}
}

func waitOutput(t *testing.T, b *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q never showed %q", b.String(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// endless is a stdin that never ends and counts what was read of it.
type endless struct{ n atomic.Int64 }

func (e *endless) Read(p []byte) (int, error) {
	e.n.Add(int64(len(p)))
	return len(p), nil
}

// TestExecIOCancelKills: a client that cancels kills the command, even one
// that reads none of the stdin it is sent: the server reads the body all
// along, and the window keeps the client from sending more than it may.
func TestExecIOCancelKills(t *testing.T) {
	f := newFakeExec()
	c := fakeServer(t, f)
	for _, stdin := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		src := &endless{}
		s := client.ExecStreams{}
		if stdin {
			s.Stdin = src
		}
		req := fabric.ExecRequest{AttemptID: "att_1", Args: []string{"wait"}, TTY: !stdin}
		errc := make(chan error, 1)
		go func() {
			_, err := c.ExecIO(ctx, v1.ExecRequest(req), s)
			errc <- err
		}()
		<-f.start
		if stdin {
			for src.n.Load() < v1.StdinWindow {
				time.Sleep(5 * time.Millisecond)
			}
		}
		time.Sleep(50 * time.Millisecond)
		cancel()
		select {
		case err := <-errc:
			if errdefs.CodeOf(err) != errdefs.CodeDeadlineExceeded {
				t.Fatalf("cancelled exec: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("ExecIO did not return after its context was cancelled")
		}
		select {
		case <-f.killed:
		case <-time.After(time.Minute):
			t.Fatalf("stdin %v: the command lived on after its client left", stdin)
		}
		if n := src.n.Load(); n > v1.StdinWindow {
			t.Fatalf("the client read %d bytes of stdin the command never took; window %d", n, v1.StdinWindow)
		}
	}
}

// TestExecIOErrorBeforeStart: a command that cannot start is an ordinary
// error, and a stdin that is never written does not hold ExecIO.
func TestExecIOErrorBeforeStart(t *testing.T) {
	f := newFakeExec()
	c := fakeServer(t, f)
	inR, inW := io.Pipe()
	defer inW.Close()
	_, err := c.ExecIO(context.Background(), v1.ExecRequest{AttemptID: "att_1", Args: []string{"missing"}}, client.ExecStreams{Stdin: inR})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("exec that cannot start: %v", err)
	}
	inW.Close()
	// A stdin that fails kills the command and is the error.
	_, err = c.ExecIO(context.Background(), v1.ExecRequest{AttemptID: "att_1", Args: []string{"cat"}},
		client.ExecStreams{Stdin: io.MultiReader(strings.NewReader("x"), &failingReader{})})
	if err == nil || !strings.Contains(err.Error(), "read stdin: disk on fire") {
		t.Fatalf("failing stdin: %v", err)
	}
	if got := <-f.killed; got != "cat" {
		t.Fatalf("killed %s", got)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

// frames encodes client frames.
func frames(fs ...any) []byte {
	var b bytes.Buffer
	fw := wire.NewWriter(&b, nil)
	for i := 0; i < len(fs); i += 2 {
		p := fs[i+1]
		switch v := p.(type) {
		case string:
			fw.Frame(fs[i].(byte), []byte(v))
		case []byte:
			fw.Frame(fs[i].(byte), v)
		}
	}
	return b.Bytes()
}

// TestExecStreamProtocolErrors: what a client may not send. Before the
// command runs it is a JSON error; after, the command is killed and the
// exit frame says invalid_argument.
func TestExecStreamProtocolErrors(t *testing.T) {
	f := newFakeExec()
	c := fakeServer(t, f)
	reqJSON := func(args string, stdin bool) string {
		b, _ := json.Marshal(fabric.ExecRequest{AttemptID: "att_1", Args: []string{args}, Stdin: stdin})
		return string(b)
	}
	big := make([]byte, wire.MaxPayload)
	var overflow []any
	overflow = append(overflow, v1.FrameRequest, reqJSON("wait", true))
	for range v1.StdinWindow/len(big) + 1 {
		overflow = append(overflow, v1.FrameStdin, big)
	}
	for _, tc := range []struct {
		name    string
		body    []byte
		status  int    // of a JSON error, or 200 for an exit frame
		killed  string // the command killed for it
		message string
	}{
		{"no request frame", frames(v1.FrameStdin, "x"), 400, "", "must start with a request frame"},
		{"empty body", nil, 400, "", "must start with a request frame"},
		{"unknown field", frames(v1.FrameRequest, `{"attempt_id":"att_1","args":["cat"],"x":1}`), 400, "", "unknown field"},
		{"no command", frames(v1.FrameRequest, `{"attempt_id":"att_1"}`), 400, "", "no command"},
		{"stdin not asked for", frames(v1.FrameRequest, reqJSON("wait", false), v1.FrameStdin, "x"), 200, "wait", "without stdin"},
		{"stdin beyond the window", frames(overflow...), 200, "wait", "window"},
		{"stdin after its end", frames(v1.FrameRequest, reqJSON("wait", true), v1.FrameStdin, "", v1.FrameStdin, "x"), 200, "wait", "after its end"},
		{"unknown frame", frames(v1.FrameRequest, reqJSON("wait", true), byte(9), "x"), 200, "wait", "unexpected frame id 9"},
		{"short resize", frames(v1.FrameRequest, reqJSON("wait", true), v1.FrameResize, "abc"), 200, "wait", "resize frame of 3 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The body stays open after the frames, as a live client's does.
			var body io.Reader = bytes.NewReader(nil)
			if tc.body != nil {
				pr, pw := io.Pipe()
				defer pw.Close()
				go func() { pw.Write(tc.body) }()
				body = pr
			}
			raw := rawOf(c)
			hr, _ := http.NewRequest(http.MethodPost, raw.base+"/v1/exec", body)
			hr.Header.Set("Content-Type", v1.MediaExecStream)
			resp, err := raw.hc.Do(hr)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			<-f.forms
			if resp.StatusCode != tc.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			var e *errdefs.Error
			if tc.status != 200 {
				var body errdefs.Error
				if jerr := json.NewDecoder(resp.Body).Decode(&body); jerr != nil {
					t.Fatal(jerr)
				}
				err = &body
			} else {
				p, rerr := wire.ReadOutput(wire.NewReader(resp.Body), io.Discard, io.Discard, func(uint32) {})
				if rerr != nil {
					t.Fatal(rerr)
				}
				_, err = wire.ExitPayload(p)
				if got := <-f.killed; got != tc.killed {
					t.Fatalf("killed %s", got)
				}
				<-f.start
			}
			if !errors.As(err, &e) || e.Code != errdefs.CodeInvalidArgument || !strings.Contains(e.Message, tc.message) {
				t.Fatalf("got %v, want invalid_argument with %q", err, tc.message)
			}
		})
	}
}

// TestStdinQueue: the queue never blocks its writer, bounds what is in
// flight, and ends in order.
func TestStdinQueue(t *testing.T) {
	q := newStdinQueue()
	if err := q.push(make([]byte, v1.StdinWindow)); err != nil {
		t.Fatal(err)
	}
	if err := q.push([]byte{1}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("push beyond the window: %v", err)
	}
	p, ok := q.pop()
	if !ok || len(p) != v1.StdinWindow {
		t.Fatalf("pop: %d %v", len(p), ok)
	}
	if err := q.push([]byte{1}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal("a chunk being written still counts against the window")
	}
	q.release(len(p))
	if err := q.push([]byte{1}); err != nil {
		t.Fatal(err)
	}
	q.end()
	if p, ok := q.pop(); !ok || !bytes.Equal(p, []byte{1}) {
		t.Fatalf("queued before the end: %v %v", p, ok)
	}
	if p, ok := q.pop(); !ok || p != nil {
		t.Fatalf("the end: %v %v", p, ok)
	}
	q.close()
	if _, ok := q.pop(); ok {
		t.Fatal("pop after close")
	}
	var ack [4]byte
	binary.BigEndian.PutUint32(ack[:], 7)
	if got := frames(v1.FrameStdinAck, ack[:]); !bytes.Equal(got, []byte{6, 0, 0, 0, 4, 0, 0, 0, 7}) {
		t.Fatalf("ack frame % x", got)
	}
}
