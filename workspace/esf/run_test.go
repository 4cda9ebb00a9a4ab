package esf

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

func TestRun(t *testing.T) {
	p := newProvider(t)
	s := create(t, p, workspace.Spec{WorkDir: "work", Env: map[string]string{"SESSION": "s1", "BOTH": "session"}})
	ctx := t.Context()
	if err := s.Write(ctx, "/data/sub/.keep", nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		spec    sandbox.Spec
		cmd     string
		out     string
		errOut  string
		code    int
		errIs   error
		maxTime time.Duration
	}{
		{name: "streams apart", cmd: "echo out; echo err >&2; exit 3", out: "out\n", errOut: "err\n", code: 3},
		{name: "cwd is the spec's workdir", cmd: "pwd", out: "/root/work\n"},
		{name: "session env", cmd: `echo "$SESSION $BOTH"`, out: "s1 session\n"},
		{name: "run env on top", spec: sandbox.Spec{Env: map[string]string{"BOTH": "run", "X": "a b"}}, cmd: `echo "$BOTH $X"`, out: "run a b\n"},
		{name: "workdir relative to cwd", spec: sandbox.Spec{WorkDir: "../../data/sub"}, cmd: "pwd", out: "/data/sub\n"},
		{name: "workdir with ~", spec: sandbox.Spec{WorkDir: "~"}, cmd: "pwd", out: "/root\n"},
		{name: "missing workdir", spec: sandbox.Spec{WorkDir: "/nope"}, cmd: "true", errIs: fs.ErrNotExist},
		{name: "signal exit code", cmd: "kill -9 $$", code: 137},
		{name: "timeout kills", spec: sandbox.Spec{Timeout: 300 * time.Millisecond}, cmd: "sleep 30", errIs: context.DeadlineExceeded, maxTime: 10 * time.Second},
		{name: "stdin", spec: sandbox.Spec{Stdin: strings.NewReader("x\ny\n")}, cmd: "cat; echo end", out: "x\ny\nend\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			res, err := s.Run(ctx, tc.spec, tc.cmd)
			if tc.errIs != nil {
				if !errors.Is(err, tc.errIs) {
					t.Fatalf("err = %v, want %v", err, tc.errIs)
				}
				if tc.maxTime > 0 && time.Since(start) > tc.maxTime {
					t.Errorf("took %v", time.Since(start))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Stdout) != tc.out || string(res.Stderr) != tc.errOut || res.ExitCode != tc.code {
				t.Errorf("got stdout %q stderr %q code %d; want %q %q %d", res.Stdout, res.Stderr, res.ExitCode, tc.out, tc.errOut, tc.code)
			}
		})
	}
}

// lineWriter records when each write arrived.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	first time.Time
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first.IsZero() {
		w.first = time.Now()
	}
	return w.buf.Write(p)
}

func TestRunStreamsOutput(t *testing.T) {
	p := newProvider(t)
	s := create(t, p, workspace.Spec{})
	var out, errw lineWriter
	start := time.Now()
	res, err := s.Run(t.Context(), sandbox.Spec{Stdout: &out, Stderr: &errw}, "echo early; echo warn >&2; sleep 1; echo late")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != 0 || len(res.Stderr) != 0 {
		t.Errorf("result kept output that went to the writers: %q %q", res.Stdout, res.Stderr)
	}
	if out.buf.String() != "early\nlate\n" || errw.buf.String() != "warn\n" {
		t.Errorf("streamed %q and %q", out.buf.String(), errw.buf.String())
	}
	if d := out.first.Sub(start); d > 900*time.Millisecond {
		t.Errorf("first output arrived after %v: not streamed", d)
	}
}

// TestRunCancelLeavesNoProcess: cancelling Run mid-command kills it and its
// children at once; the session goes on; closing it then leaves no
// attempt, lease or container.
func TestRunCancelLeavesNoProcess(t *testing.T) {
	p := newProvider(t)
	s := create(t, p, workspace.Spec{})
	att := attemptOf(s)
	ctx, cancel := context.WithCancel(t.Context())
	started := make(chan struct{})
	var out lineWriter
	var before []string // what ran just before the cancel
	var cancelled time.Time
	go func() {
		defer close(started)
		defer func() { cancelled = time.Now(); cancel() }()
		for range 500 {
			out.mu.Lock()
			ok := strings.Contains(out.buf.String(), "ready")
			out.mu.Unlock()
			if ok {
				before = processes(t, att)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	begin := time.Now()
	_, err := s.Run(ctx, sandbox.Spec{Stdout: &out}, "sleep 300 & echo ready; sleep 301")
	<-started
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
	if d := time.Since(begin); d > 15*time.Second {
		t.Errorf("cancel took %v", d)
	}
	if !strings.Contains(strings.Join(before, "\n"), "sleep 300") {
		t.Errorf("before the cancel, runc ps showed %q: the check below proves nothing", before)
	}
	// The daemon kills the tree when it sees the client leave, just after
	// Run returned: the API has no way to wait for that (see doc.go).
	procs := processes(t, att)
	for deadline := time.Now().Add(10 * time.Second); len(procs) > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		procs = processes(t, att)
	}
	if len(procs) > 0 {
		t.Errorf("processes left in the container: %q", procs)
	}
	t.Logf("processes gone %v after the cancel", time.Since(cancelled).Round(time.Millisecond))
	if res, err := s.Run(t.Context(), sandbox.Spec{}, "echo alive"); err != nil || string(res.Stdout) != "alive\n" {
		t.Fatalf("run after a cancelled one: %q, %v", res.Stdout, err)
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := attemptState(t, att); st != v1.AttemptReleased {
		t.Errorf("attempt after close: %s", st)
	}
	if c := containers(t, att); len(c) > 0 {
		t.Errorf("containers after close: %v", c)
	}
	noLeaks(t)
}

// TestCloseCutsRunningCalls: Close on a handle ends the calls in flight on
// it with ErrClosed and does not wait for them to finish on their own.
func TestCloseCutsRunningCalls(t *testing.T) {
	p := newProvider(t)
	s := create(t, p, workspace.Spec{})
	errc := make(chan error, 1)
	go func() {
		_, err := s.Run(context.Background(), sandbox.Spec{}, "sleep 300")
		errc <- err
	}()
	time.Sleep(500 * time.Millisecond)
	begin := time.Now()
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, workspace.ErrClosed) {
		t.Errorf("run cut by close: %v", err)
	}
	if d := time.Since(begin); d > 15*time.Second {
		t.Errorf("close took %v", d)
	}
	noLeaks(t)
}
