package runc

import (
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

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/executor"
)

// TestExecSemantics: output separation, exit codes (signals as 128+N),
// env, workdir and user with container defaults and per-exec overrides.
func TestExecSemantics(t *testing.T) {
	v := newEnv(t)
	v.start("sem", executor.Spec{
		Env:     []string{"FOO=container", "KEEP=kept"},
		Workdir: "/tmp",
		User:    executor.User{UID: 1000, GID: 1001},
	})
	root := &executor.User{}
	for _, tc := range []struct {
		name       string
		x          executor.ExecSpec
		args       []string
		stdout     string
		stderr     string
		code       int
		stderrPart bool // stderr need only contain the wanted text
	}{
		{name: "separate streams", args: []string{"sh", "-c", "echo out; echo err >&2; echo out2"}, stdout: "out\nout2\n", stderr: "err\n"},
		{name: "exit code", args: []string{"sh", "-c", "exit 3"}, code: 3},
		{name: "killed by SIGKILL", args: []string{"sh", "-c", "kill -9 $$"}, code: 128 + 9},
		{name: "killed by SIGTERM", args: []string{"sh", "-c", "kill -TERM $$"}, code: 128 + 15},
		{name: "killed by SIGSEGV", args: []string{"sh", "-c", "kill -SEGV $$"}, code: 128 + 11},
		{name: "container env", args: []string{"sh", "-c", `echo "$FOO $KEEP $PATH"`},
			stdout: "container kept /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"},
		{name: "exec env overrides", x: executor.ExecSpec{Env: []string{"FOO=exec", "BAR=bar", "KEEP"}},
			args: []string{"sh", "-c", `echo "$FOO $BAR [$KEEP]"`}, stdout: "exec bar []\n"},
		{name: "container workdir", args: []string{"pwd"}, stdout: "/tmp\n"},
		{name: "exec workdir", x: executor.ExecSpec{Workdir: "/bin"}, args: []string{"pwd"}, stdout: "/bin\n"},
		{name: "container user", args: []string{"sh", "-c", "id -u; id -g; id -G"}, stdout: "1000\n1001\n1001\n"},
		{name: "exec user", x: executor.ExecSpec{User: root}, args: []string{"sh", "-c", "id -u; id -g"}, stdout: "0\n0\n"},
		{name: "non-root reopens its stdio", args: []string{"sh", "-c", "echo via-proc > /dev/stdout; echo e > /dev/stderr"}, stdout: "via-proc\n", stderr: "e\n"},
		{name: "no new privileges", args: []string{"sh", "-c", "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"}, stdout: "NoNewPrivs:\t1\nSeccomp:\t2\n"},
		{name: "large output", args: []string{"sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' a"}, stdout: strings.Repeat("a", 1000000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := v.run(v.ctx, "sem", tc.x, tc.args...)
			if r.err != nil {
				t.Fatalf("exec: %v", r.err)
			}
			if r.code != tc.code || r.stdout != tc.stdout || r.stderr != tc.stderr {
				t.Fatalf("got code %d stdout %.200q stderr %q; want %d %.200q %q", r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}

	for _, tc := range []struct {
		name string
		x    executor.ExecSpec
		want error
		msg  string
	}{
		{"no such command", executor.ExecSpec{Args: []string{"no-such-command"}}, executor.ErrInvalidArgument, "executable file not found"},
		{"no such workdir", executor.ExecSpec{Args: []string{"true"}, Workdir: "/nowhere"}, executor.ErrInvalidArgument, "nowhere"},
		{"empty args", executor.ExecSpec{}, executor.ErrInvalidArgument, "no command"},
		{"relative workdir", executor.ExecSpec{Args: []string{"true"}, Workdir: "tmp"}, executor.ErrInvalidArgument, "absolute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := v.e.Exec(v.ctx, "sem", tc.x)
			if err == nil {
				p.Wait()
				t.Fatal("exec succeeded")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("exec: %v; want %v mentioning %q", err, tc.want, tc.msg)
			}
		})
	}
}

// TestExecStdin: what the caller writes reaches the process; Close is EOF.
func TestExecStdin(t *testing.T) {
	v := newEnv(t)
	v.start("in", executor.Spec{})
	var out syncBuffer
	p, err := v.e.Exec(v.ctx, "in", executor.ExecSpec{Args: []string{"sh", "-c", "cat; echo done"}, Stdin: true, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(p.Stdin(), "line one\n"); err != nil {
		t.Fatal(err)
	}
	// Echoed back before stdin closes: stdin and stdout stream.
	out.waitFor(t, "line one\n")
	io.WriteString(p.Stdin(), "line two\n")
	if err := p.Stdin().Close(); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 0 || err != nil || out.String() != "line one\nline two\ndone\n" {
		t.Fatalf("got %d %v %q", code, err, out.String())
	}
	if _, err := p.Stdin().Write([]byte("late")); err == nil {
		t.Fatal("a write after Wait succeeded")
	}
	if err := p.Resize(executor.WinSize{Rows: 1, Cols: 1}); !errors.Is(err, executor.ErrFailedPrecondition) {
		t.Fatalf("resize without a tty: %v", err)
	}

	// A process that exits without reading stdin ends the exec though
	// the caller never closed it.
	p, err = v.e.Exec(v.ctx, "in", executor.ExecSpec{Args: []string{"true"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("true with an open stdin: %d %v", code, err)
	}

	// Without Stdin the process reads /dev/null and there is no writer.
	p, err = v.e.Exec(v.ctx, "in", executor.ExecSpec{Args: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Stdin() != nil {
		t.Fatal("Stdin without ExecSpec.Stdin")
	}
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("cat </dev/null: %d %v", code, err)
	}
}

// TestExecStreams: output arrives while the process still runs, and a
// background process holding the pipe does not hold Wait.
func TestExecStreams(t *testing.T) {
	t.Parallel() // mostly sleeps
	v := newEnv(t)
	v.start("stream", executor.Spec{})
	// The command waits for the test to create /tmp/go after it saw the
	// first line: a line that arrives first came while the command ran.
	// (Timing the lines apart would fail when load delays the first.)
	var out syncBuffer
	p, err := v.e.Exec(v.ctx, "stream", executor.ExecSpec{Args: []string{"sh", "-c",
		"echo early; while [ ! -e /tmp/go ]; do sleep 0.01; done; echo late"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "early\n")
	if err := os.WriteFile(filepath.Join(v.rootfs, "tmp", "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if out.String() != "early\nlate\n" {
		t.Fatalf("output %q", out.String())
	}

	// A background process that keeps stdout holds Wait, as with docker
	// exec or ssh; one that lets go of it does not, and lives on.
	var bg syncBuffer
	start := time.Now()
	p, err = v.e.Exec(v.ctx, "stream", executor.ExecSpec{Args: []string{"sh", "-c", "sleep 1 & echo done"}, Stdout: &bg})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 0 || err != nil || bg.String() != "done\n" {
		t.Fatalf("got %d %v %q", code, err, bg.String())
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("Wait returned after %v, before the background process let go of stdout", d)
	}
	start = time.Now()
	r := v.run(v.ctx, "stream", executor.ExecSpec{}, "sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!")
	if r.code != 0 || r.err != nil {
		t.Fatalf("got %d %v", r.code, r.err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("Wait took %v with a detached background process", d)
	}
	if got := v.sh(t, "stream", "cat /proc/"+strings.TrimSpace(r.stdout)+"/cmdline"); got != "sleep\x001000\x00" {
		t.Fatalf("the background process did not live on: %q", got)
	}

	// An escaped daemon (own session, parent gone) that holds stdout
	// still cannot hold a timed-out exec: runc itself is killed.
	// It times out once it wrote x, so the daemon is there by then.
	ctx, expire := withExpiry(v.ctx)
	defer expire()
	var dout syncBuffer
	p, err = v.e.Exec(ctx, "stream", executor.ExecSpec{Args: []string{"sh", "-c", "(setsid sleep 1000 &); echo x"}, Stdout: &dout})
	if err != nil {
		t.Fatal(err)
	}
	dout.waitFor(t, "x\n")
	expire()
	start = time.Now()
	code, err := p.Wait()
	if !errors.Is(err, context.DeadlineExceeded) || code != 137 || dout.String() != "x\n" {
		t.Fatalf("got %d %v %q", code, err, dout.String())
	}
	if d := time.Since(start); d > killGrace+time.Minute {
		t.Fatalf("took %v", d)
	}
}

// TestExecPTY: a terminal: isatty, output, initial size, resize, exit code.
func TestExecPTY(t *testing.T) {
	v := newEnv(t)
	v.start("tty", executor.Spec{})

	r := v.run(v.ctx, "tty", executor.ExecSpec{TTY: true, Size: executor.WinSize{Rows: 24, Cols: 80}},
		"sh", "-c", "test -t 0 && test -t 1 && test -t 2 && echo isatty; tty; stty size; echo $TERM; echo to-stderr >&2; exit 5")
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := "isatty\r\n/dev/pts/0\r\n24 80\r\nxterm\r\nto-stderr\r\n"
	if r.code != 5 || r.stdout != want || r.stderr != "" {
		t.Fatalf("got code %d stdout %q stderr %q; want 5 %q", r.code, r.stdout, r.stderr, want)
	}

	var out syncBuffer
	p, err := v.e.Exec(v.ctx, "tty", executor.ExecSpec{Args: []string{"sh"}, TTY: true, Stdin: true, Stdout: &out,
		Size: executor.WinSize{Rows: 30, Cols: 90}})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin(), "stty size\n")
	out.waitFor(t, "30 90")
	if err := p.Resize(executor.WinSize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin(), "stty size\n")
	out.waitFor(t, "40 100")
	p.Stdin().Close() // a terminal's EOF is ^D, not a close: the shell lives on
	io.WriteString(p.Stdin(), "exit 7\n")
	if code, err := p.Wait(); code != 7 || err != nil {
		t.Fatalf("interactive shell: %d %v; output %q", code, err, out.String())
	}
	if err := p.Resize(executor.WinSize{Rows: 1, Cols: 1}); !errors.Is(err, executor.ErrFailedPrecondition) {
		t.Fatalf("resize after Wait: %v", err)
	}
}

// TestExecTimeoutAndCancel: the end of the context kills the process, its
// session and its descendants (even one in a session of its own), reports
// deadline_exceeded, leaves no process, and spares other execs.
func TestExecTimeoutAndCancel(t *testing.T) {
	t.Parallel() // mostly sleeps
	v := newEnv(t)
	v.start("kill", executor.Spec{})

	// A bystander in its own session must survive the kills below.
	bctx, bcancel := context.WithCancel(v.ctx)
	defer bcancel()
	by, err := v.e.Exec(bctx, "kill", executor.ExecSpec{Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		script string
	}{
		{"single", "echo started; sleep 1000"},
		{"children and grandchildren", "sleep 1000 & (sleep 1000 & sleep 1000) & echo started; sleep 1000"},
		{"child in its own session", "setsid sleep 1000 & echo started; wait"},
		{"ignores SIGTERM", "trap '' TERM; sleep 1000 & echo started; wait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// It times out once the script forked its tree ("started"):
			// a fixed timeout may fire before, on a loaded machine.
			ctx, expire := withExpiry(v.ctx)
			defer expire()
			var out syncBuffer
			p, err := v.e.Exec(ctx, "kill", executor.ExecSpec{Args: []string{"sh", "-c", tc.script}, Stdout: &out})
			if err != nil {
				t.Fatal(err)
			}
			out.waitFor(t, "started")
			expire()
			start := time.Now()
			code, err := p.Wait()
			if !errors.Is(err, context.DeadlineExceeded) || errdefs.CodeOf(err) != errdefs.CodeDeadlineExceeded {
				t.Fatalf("err %v (code %s), want deadline exceeded", err, errdefs.CodeOf(err))
			}
			if code != 128+9 {
				t.Errorf("code %d, want 137", code)
			}
			if d := time.Since(start); d > time.Minute {
				t.Errorf("took %v", d)
			}
			v.requireOnly(t, "kill", by.Pid())
		})
	}

	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(v.ctx)
		var out syncBuffer
		p, err := v.e.Exec(ctx, "kill", executor.ExecSpec{Args: []string{"sh", "-c", "echo started; sleep 1000 & sleep 1000"}, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		out.waitFor(t, "started")
		cancel()
		if _, err := p.Wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want canceled", err)
		}
		v.requireOnly(t, "kill", by.Pid())
	})

	t.Run("cancelled before exec", func(t *testing.T) {
		ctx, cancel := context.WithCancel(v.ctx)
		cancel()
		if _, err := v.e.Exec(ctx, "kill", executor.ExecSpec{Args: []string{"true"}}); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v", err)
		}
	})

	bcancel()
	if _, err := by.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("bystander: %v", err)
	}
	v.requireOnly(t, "kill")
}

// requireOnly fails unless the container holds only its init and the
// given processes, once the init has reaped what was killed.
func (v *env) requireOnly(t *testing.T, id string, pids ...int) {
	t.Helper()
	info, err := v.e.State(v.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		want := map[int]bool{info.Pid: true}
		for _, p := range pids {
			want[p] = true
		}
		var extra []string
		for _, st := range v.containerPids(t, id) {
			if !want[st.pid] {
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", st.pid))
				extra = append(extra, fmt.Sprintf("%d(%c %q)", st.pid, st.state, cmd))
			}
			delete(want, st.pid)
		}
		if len(extra) == 0 && len(want) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container processes: extra %v, missing %v", extra, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestExecConcurrent: many execs into one container at once.
func TestExecConcurrent(t *testing.T) {
	v := newEnv(t)
	v.start("many", executor.Spec{})
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out, errb syncBuffer
			p, err := v.e.Exec(v.ctx, "many", executor.ExecSpec{Args: []string{"sh", "-c", fmt.Sprintf("echo %d; echo e%d >&2; exit %d", i, i, i)}, Stdout: &out, Stderr: &errb})
			if err != nil {
				t.Error(err)
				return
			}
			code, err := p.Wait()
			if err != nil || code != i || out.String() != fmt.Sprintf("%d\n", i) || errb.String() != fmt.Sprintf("e%d\n", i) {
				t.Errorf("exec %d: %d %v %q %q", i, code, err, out.String(), errb.String())
			}
		}()
	}
	wg.Wait()
}
