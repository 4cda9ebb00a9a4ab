// Package executortest is the conformance suite of the executor seam:
// what fabric relies on from any executor.Executor, run against the fake
// (executor/fake, without root, in milliseconds) and against runc (in CI,
// with real containers). An implementation that passes it can stand in
// for another in fabric's logic tests.
//
// The suite runs only commands a POSIX sh provides (sh, echo, cat, sleep,
// kill, exit) and touches the rootfs only through paths relative to the
// working directory: the fake runs processes on the host with their
// working directory inside the rootfs, a container sees the rootfs as /.
package executortest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/executor"
)

// Harness is what Run needs of an implementation.
type Harness struct {
	// New returns a fresh executor with nothing in it. The suite stops
	// every container it starts.
	New func(t *testing.T) executor.Executor
	// Rootfs returns a fresh directory to start a container on, with a
	// POSIX sh (and cat, sleep, kill) that an exec finds in PATH and an
	// empty, world-writable tmp/.
	Rootfs func(t *testing.T) string
	// Limits says the implementation enforces Spec.Limits (the pids
	// limit is checked: fork fails past it).
	Limits bool
	// TTY says the implementation gives execs terminals (ExecSpec.TTY);
	// without, a TTY exec must be refused as unsupported.
	TTY bool
	// CheckClean, if set, runs when a subtest has stopped its containers:
	// it fails t if the implementation left anything behind (processes,
	// state files, cgroups, goroutines).
	CheckClean func(t *testing.T, e executor.Executor)
}

// deadline bounds every wait of the suite: generous, since CI machines
// are loaded; nothing in the suite waits for it to pass.
const deadline = 2 * time.Minute

// Run runs the suite as subtests of t.
func Run(t *testing.T, h Harness) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s *suite)
	}{
		{"Lifecycle", testLifecycle},
		{"StartErrors", testStartErrors},
		{"ExecStdio", testExecStdio},
		{"ExecExitCodes", testExecExitCodes},
		{"ExecEnvAndWorkdir", testExecEnvAndWorkdir},
		{"ExecErrors", testExecErrors},
		{"ExecContextKills", testExecContextKills},
		{"StopEndsExecs", testStopEndsExecs},
		{"FreezeThaw", testFreezeThaw},
		{"ConcurrentExecs", testConcurrentExecs},
		{"Limits", testLimits},
		{"TTY", testTTY},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &suite{t: t, h: h, e: h.New(t)}
			if h.CheckClean != nil {
				// Registered first: runs after the containers are stopped.
				t.Cleanup(func() { h.CheckClean(t, s.e) })
			}
			tc.fn(t, s)
		})
	}
}

type suite struct {
	t *testing.T
	h Harness
	e executor.Executor
}

// start starts container id on a fresh rootfs (unless spec names one),
// stops it when the test ends, and returns the rootfs.
func (s *suite) start(id string, spec executor.Spec) string {
	s.t.Helper()
	if spec.Rootfs == "" {
		spec.Rootfs = s.h.Rootfs(s.t)
	}
	if err := s.e.Start(ctx(s.t), id, spec); err != nil {
		s.t.Fatalf("start %s: %v", id, err)
	}
	s.t.Cleanup(func() {
		if err := s.e.Stop(context.Background(), id); err != nil {
			s.t.Errorf("stop %s: %v", id, err)
		}
	})
	return spec.Rootfs
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return c
}

type result struct {
	stdout, stderr string
	code           int
	err            error
}

// run execs args in id with x, waits, and returns what it did.
func (s *suite) run(c context.Context, id string, x executor.ExecSpec, args ...string) result {
	var out, errb Buffer
	x.Args = args
	x.Stdout, x.Stderr = &out, &errb
	p, err := s.e.Exec(c, id, x)
	if err != nil {
		return result{code: -1, err: err}
	}
	code, err := p.Wait()
	return result{stdout: out.String(), stderr: errb.String(), code: code, err: err}
}

// sh runs script in id and fails t unless it exits 0; it returns stdout.
func (s *suite) sh(id, script string) string {
	s.t.Helper()
	r := s.run(ctx(s.t), id, executor.ExecSpec{}, "sh", "-c", script)
	if r.err != nil || r.code != 0 {
		s.t.Fatalf("sh -c %q: code %d err %v stderr %q", script, r.code, r.err, r.stderr)
	}
	return r.stdout
}

func testLifecycle(t *testing.T, s *suite) {
	c := ctx(t)
	rootfs := s.start("life-1", executor.Spec{})
	info, err := s.e.State(c, "life-1")
	if err != nil || info.ID != "life-1" || info.Status != executor.StatusRunning || info.Rootfs != rootfs {
		t.Fatalf("state of a started container: %+v %v (rootfs %s)", info, err, rootfs)
	}
	if err := s.e.Start(c, "life-1", executor.Spec{Rootfs: rootfs}); !errors.Is(err, executor.ErrExists) {
		t.Fatalf("second start of a live id: %v, want exists", err)
	}
	s.start("life-2", executor.Spec{})
	s.start("other-1", executor.Spec{})
	infos, err := s.e.List(c, "life-")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, in := range infos {
		ids = append(ids, in.ID)
	}
	if fmt.Sprint(sorted(ids)) != "[life-1 life-2]" {
		t.Fatalf("list life-: %v", ids)
	}
	if err := s.e.Stop(c, "life-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.e.State(c, "life-1"); !errors.Is(err, executor.ErrNotFound) {
		t.Fatalf("state after stop: %v, want not found", err)
	}
	// Stop is idempotent, and of an unknown id a success.
	if err := s.e.Stop(c, "life-1"); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if err := s.e.Stop(c, "never-started"); err != nil {
		t.Fatalf("stop of an unknown id: %v", err)
	}
	// The id is free again.
	if err := s.e.Start(c, "life-1", executor.Spec{Rootfs: rootfs}); err != nil {
		t.Fatalf("start after stop: %v", err)
	}
	if got := s.sh("life-1", "echo again"); got != "again\n" {
		t.Fatalf("exec in the restarted container: %q", got)
	}
	// Files the sandbox writes are in the rootfs, and stay after Stop.
	s.sh("life-1", "echo kept > tmp/file")
	if err := s.e.Stop(c, "life-1"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "tmp", "file")); err != nil || string(b) != "kept\n" {
		t.Fatalf("the sandbox's write after stop: %q %v", b, err)
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func testStartErrors(t *testing.T, s *suite) {
	c := ctx(t)
	rootfs := s.h.Rootfs(t)
	for _, tc := range []struct {
		name string
		id   string
		spec executor.Spec
		want error
	}{
		{"relative rootfs", "bad-1", executor.Spec{Rootfs: "rootfs"}, executor.ErrInvalidArgument},
		{"id escaping", "../x", executor.Spec{Rootfs: rootfs}, executor.ErrInvalidArgument},
		{"empty id", "", executor.Spec{Rootfs: rootfs}, executor.ErrInvalidArgument},
		{"bad env", "bad-2", executor.Spec{Rootfs: rootfs, Env: []string{"NOEQUALS"}}, executor.ErrInvalidArgument},
		{"bad limit", "bad-3", executor.Spec{Rootfs: rootfs, Limits: executor.Limits{Pids: -1}}, executor.ErrInvalidArgument},
	} {
		if err := s.e.Start(c, tc.id, tc.spec); !errors.Is(err, tc.want) {
			if err == nil {
				s.e.Stop(c, tc.id)
			}
			t.Errorf("%s: start: %v, want %v", tc.name, err, tc.want)
		}
	}
	// Nothing of a refused start is left.
	if infos, err := s.e.List(c, ""); err != nil || len(infos) != 0 {
		t.Fatalf("after refused starts: %+v %v", infos, err)
	}
}

func testExecStdio(t *testing.T, s *suite) {
	s.start("io", executor.Spec{})
	var out, errb Buffer
	p, err := s.e.Exec(ctx(t), "io", executor.ExecSpec{Args: []string{"sh", "-c", "cat; echo err >&2; echo done"},
		Stdin: true, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid() <= 0 {
		t.Errorf("pid %d", p.Pid())
	}
	if _, err := io.WriteString(p.Stdin(), "hello\n"); err != nil {
		t.Fatal(err)
	}
	// Output streams while the process runs.
	out.WaitFor(t, "hello\n")
	if err := p.Stdin().Close(); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait()
	if code != 0 || err != nil || out.String() != "hello\ndone\n" || errb.String() != "err\n" {
		t.Fatalf("code %d err %v stdout %q stderr %q", code, err, out.String(), errb.String())
	}
	// Wait again: the same result.
	if c2, err2 := p.Wait(); c2 != code || err2 != err {
		t.Fatalf("second wait: %d %v", c2, err2)
	}
	// Without Stdin the process reads end-of-file at once; Stdin is nil.
	var o2 Buffer
	p, err = s.e.Exec(ctx(t), "io", executor.ExecSpec{Args: []string{"sh", "-c", "cat; echo eof"}, Stdout: &o2})
	if err != nil {
		t.Fatal(err)
	}
	if p.Stdin() != nil {
		t.Error("stdin without ExecSpec.Stdin")
	}
	if code, err := p.Wait(); code != 0 || err != nil || o2.String() != "eof\n" {
		t.Fatalf("without stdin: %d %v %q", code, err, o2.String())
	}
	// No TTY: Resize is a failed precondition.
	if err := p.Resize(executor.WinSize{Rows: 10, Cols: 10}); !errors.Is(err, executor.ErrFailedPrecondition) {
		t.Errorf("resize without a tty: %v", err)
	}
	// A nil writer discards; large output arrives whole.
	r := s.run(ctx(t), "io", executor.ExecSpec{}, "sh", "-c", `i=0; while [ $i -lt 2000 ]; do echo 0123456789012345678901234567890123456789; i=$((i+1)); done`)
	if r.err != nil || r.code != 0 || len(r.stdout) != 2000*41 {
		t.Fatalf("large output: %d bytes, code %d err %v", len(r.stdout), r.code, r.err)
	}
}

func testExecExitCodes(t *testing.T, s *suite) {
	s.start("codes", executor.Spec{})
	for _, tc := range []struct {
		script string
		code   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -9 $$", 128 + 9},
		{"kill -TERM $$", 128 + 15},
	} {
		r := s.run(ctx(t), "codes", executor.ExecSpec{}, "sh", "-c", tc.script)
		if r.err != nil || r.code != tc.code {
			t.Errorf("%s: code %d err %v, want %d", tc.script, r.code, r.err, tc.code)
		}
	}
}

func testExecEnvAndWorkdir(t *testing.T, s *suite) {
	rootfs := s.start("env", executor.Spec{Env: []string{"FOO=container", "KEEP=kept"}, Workdir: "/tmp"})
	if got := s.sh("env", `echo "$FOO $KEEP"`); got != "container kept\n" {
		t.Errorf("container env: %q", got)
	}
	r := s.run(ctx(t), "env", executor.ExecSpec{Env: []string{"FOO=exec", "BAR=bar", "KEEP"}}, "sh", "-c", `echo "$FOO $BAR [$KEEP]"`)
	if r.err != nil || r.stdout != "exec bar []\n" {
		t.Errorf("exec env: %q %v", r.stdout, r.err)
	}
	if r := s.run(ctx(t), "env", executor.ExecSpec{}, "sh", "-c", `command -v cat >/dev/null && echo found`); r.stdout != "found\n" {
		t.Errorf("PATH finds cat: %q %q", r.stdout, r.stderr)
	}
	// The container's workdir, and an exec's own, are in the rootfs.
	s.sh("env", "echo w > in-workdir")
	if _, err := os.Stat(filepath.Join(rootfs, "tmp", "in-workdir")); err != nil {
		t.Errorf("write in the container's workdir: %v", err)
	}
	if err := os.Mkdir(filepath.Join(rootfs, "tmp", "sub"), 0o777); err != nil {
		t.Fatal(err)
	}
	if r := s.run(ctx(t), "env", executor.ExecSpec{Workdir: "/tmp/sub"}, "sh", "-c", "echo s > in-sub"); r.err != nil || r.code != 0 {
		t.Fatalf("exec workdir: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "tmp", "sub", "in-sub")); err != nil {
		t.Errorf("write in the exec's workdir: %v", err)
	}
}

func testExecErrors(t *testing.T, s *suite) {
	s.start("errs", executor.Spec{})
	c := ctx(t)
	for _, tc := range []struct {
		name string
		id   string
		x    executor.ExecSpec
		want error
	}{
		{"no such command", "errs", executor.ExecSpec{Args: []string{"no-such-command-esf"}}, executor.ErrInvalidArgument},
		{"no such workdir", "errs", executor.ExecSpec{Args: []string{"true"}, Workdir: "/nowhere-esf"}, executor.ErrInvalidArgument},
		{"empty args", "errs", executor.ExecSpec{}, executor.ErrInvalidArgument},
		{"relative workdir", "errs", executor.ExecSpec{Args: []string{"true"}, Workdir: "tmp"}, executor.ErrInvalidArgument},
		{"no such container", "nope", executor.ExecSpec{Args: []string{"true"}}, executor.ErrNotFound},
	} {
		p, err := s.e.Exec(c, tc.id, tc.x)
		if err == nil {
			p.Wait()
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: exec: %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, op := range []func(context.Context, string) error{s.e.Freeze, s.e.Thaw} {
		if err := op(c, "nope"); !errors.Is(err, executor.ErrNotFound) {
			t.Errorf("freeze/thaw of an unknown id: %v", err)
		}
	}
	if _, err := s.e.State(c, "nope"); !errors.Is(err, executor.ErrNotFound) {
		t.Errorf("state of an unknown id: %v", err)
	}
}

// testExecContextKills: the end of Exec's context kills the process and
// what it started, even a child that holds the output open.
func testExecContextKills(t *testing.T, s *suite) {
	s.start("kill", executor.Spec{})
	for _, cause := range []string{"cancel", "timeout"} {
		c, cancel := context.WithCancel(context.Background())
		if cause == "timeout" {
			c, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
		}
		var out Buffer
		p, err := s.e.Exec(c, "kill", executor.ExecSpec{Args: []string{"sh", "-c", "sleep 1000 & echo started; sleep 1000"}, Stdout: &out})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		out.WaitFor(t, "started")
		if cause == "cancel" {
			cancel()
		}
		code, err := waitWithin(t, p)
		cancel()
		want := context.Canceled
		if cause == "timeout" {
			want = context.DeadlineExceeded
		}
		if !errors.Is(err, want) || code != 128+9 {
			t.Errorf("%s: code %d err %v, want 137 and %v", cause, code, err, want)
		}
	}
	// The container lives on.
	if got := s.sh("kill", "echo alive"); got != "alive\n" {
		t.Fatalf("after the kills: %q", got)
	}
}

// waitWithin waits for p, failing t if that takes past the suite's deadline.
func waitWithin(t *testing.T, p executor.Process) (int, error) {
	t.Helper()
	type res struct {
		code int
		err  error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := p.Wait()
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		return r.code, r.err
	case <-time.After(deadline):
		t.Fatal("wait did not return")
		return 0, nil
	}
}

func testStopEndsExecs(t *testing.T, s *suite) {
	s.start("stop", executor.Spec{})
	var out Buffer
	p, err := s.e.Exec(context.Background(), "stop", executor.ExecSpec{Args: []string{"sh", "-c", "sleep 1000 & echo started; sleep 1000"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	out.WaitFor(t, "started")
	if err := s.e.Stop(ctx(t), "stop"); err != nil {
		t.Fatal(err)
	}
	if code, _ := waitWithin(t, p); code != 128+9 {
		t.Fatalf("exec ended by stop: code %d, want 137", code)
	}
	if _, err := s.e.Exec(ctx(t), "stop", executor.ExecSpec{Args: []string{"true"}}); !errors.Is(err, executor.ErrNotFound) {
		t.Fatalf("exec after stop: %v, want not found", err)
	}
	// A frozen container stops too.
	s.start("stop-frozen", executor.Spec{})
	p, err = s.e.Exec(context.Background(), "stop-frozen", executor.ExecSpec{Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.e.Freeze(ctx(t), "stop-frozen"); err != nil {
		t.Fatal(err)
	}
	if err := s.e.Stop(ctx(t), "stop-frozen"); err != nil {
		t.Fatal(err)
	}
	if code, _ := waitWithin(t, p); code != 128+9 {
		t.Fatalf("exec of a frozen container ended by stop: code %d, want 137", code)
	}
}

func testFreezeThaw(t *testing.T, s *suite) {
	c := ctx(t)
	rootfs := s.start("fz", executor.Spec{Workdir: "/tmp"})
	ectx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out Buffer
	p, err := s.e.Exec(ectx, "fz", executor.ExecSpec{Args: []string{"sh", "-c",
		"i=0; while :; do i=$((i+1)); echo $i > n; [ $i = 3 ] && echo started; sleep 0.01; done"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	out.WaitFor(t, "started")
	counter := func() string {
		b, _ := os.ReadFile(filepath.Join(rootfs, "tmp", "n"))
		return string(b)
	}
	for range 2 { // idempotent
		if err := s.e.Freeze(c, "fz"); err != nil {
			t.Fatal(err)
		}
	}
	if info, err := s.e.State(c, "fz"); err != nil || info.Status != executor.StatusPaused {
		t.Fatalf("state while frozen: %+v %v", info, err)
	}
	// Frozen: nothing runs, the tree stays still. (Reading twice can only
	// miss a bug, never invent one.)
	before := counter()
	time.Sleep(50 * time.Millisecond)
	if after := counter(); after != before {
		t.Fatalf("counter moved while frozen: %q -> %q", before, after)
	}
	if x, err := s.e.Exec(c, "fz", executor.ExecSpec{Args: []string{"true"}}); !errors.Is(err, executor.ErrFailedPrecondition) {
		if err == nil {
			x.Wait()
		}
		t.Errorf("exec in a frozen container: %v, want failed precondition", err)
	}
	for range 2 {
		if err := s.e.Thaw(c, "fz"); err != nil {
			t.Fatal(err)
		}
	}
	if info, err := s.e.State(c, "fz"); err != nil || info.Status != executor.StatusRunning {
		t.Fatalf("state after thaw: %+v %v", info, err)
	}
	end := time.Now().Add(deadline)
	for c0 := counter(); counter() == c0; {
		if time.Now().After(end) {
			t.Fatal("no progress after thaw")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if _, err := waitWithin(t, p); !errors.Is(err, context.Canceled) {
		t.Fatalf("exec after the freeze: %v", err)
	}
}

func testConcurrentExecs(t *testing.T, s *suite) {
	s.start("conc", executor.Spec{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			want := fmt.Sprintf("exec %d\n", i)
			r := s.run(ctx(t), "conc", executor.ExecSpec{}, "sh", "-c", "echo "+strings.TrimSpace(want))
			if r.err != nil || r.code != 0 || r.stdout != want {
				errs <- fmt.Errorf("exec %d: %+v", i, r)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testLimits(t *testing.T, s *suite) {
	if !s.h.Limits {
		t.Skip("the implementation enforces no limits")
	}
	s.start("lim", executor.Spec{Limits: executor.Limits{Pids: executor.MinPids}})
	r := s.run(ctx(t), "lim", executor.ExecSpec{}, "sh", "-c", `i=0; while [ $i -lt 40 ]; do sleep 1000 >/dev/null 2>&1 & i=$((i+1)); done; echo spawned`)
	if !strings.Contains(r.stdout+r.stderr, "fork") {
		t.Fatalf("40 processes under a limit of %d: code %d err %v stdout %q stderr %q", executor.MinPids, r.code, r.err, r.stdout, r.stderr)
	}
}

func testTTY(t *testing.T, s *suite) {
	s.start("tty", executor.Spec{})
	var out Buffer
	x := executor.ExecSpec{Args: []string{"sh"}, TTY: true, Stdin: true, Stdout: &out, Size: executor.WinSize{Rows: 30, Cols: 90}}
	p, err := s.e.Exec(ctx(t), "tty", x)
	if !s.h.TTY {
		if err == nil {
			p.Wait()
		}
		if !errors.Is(err, executor.ErrUnsupported) {
			t.Fatalf("tty exec without terminals: %v, want unsupported", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin(), "test -t 0 && test -t 1 && echo isatty; stty size\n")
	out.WaitFor(t, "30 90")
	if !strings.Contains(out.String(), "isatty") {
		t.Errorf("no terminal: %q", out.String())
	}
	if err := p.Resize(executor.WinSize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin(), "stty size\n")
	out.WaitFor(t, "40 100")
	io.WriteString(p.Stdin(), "exit 7\n")
	if code, err := waitWithin(t, p); code != 7 || err != nil {
		t.Fatalf("interactive shell: %d %v; output %q", code, err, out.String())
	}
	if err := p.Resize(executor.WinSize{Rows: 1, Cols: 1}); !errors.Is(err, executor.ErrFailedPrecondition) {
		t.Fatalf("resize after Wait: %v", err)
	}
}

// Buffer is an io.Writer safe for concurrent use whose content a test can
// wait for.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// WaitFor waits until the buffer holds s, failing t after a generous
// deadline.
func (b *Buffer) WaitFor(t testing.TB, s string) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(end) {
			t.Fatalf("waited for %q; have %q", s, b.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
}
