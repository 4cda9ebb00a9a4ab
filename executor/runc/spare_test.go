package runc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
)

// hasSpare reports whether container id still holds a spare.
func hasSpare(v *env, id string) bool {
	v.e.pool.mu.Lock()
	defer v.e.pool.mu.Unlock()
	return v.e.pool.spares[id] != nil
}

// spareOf is container id's spare, once made (nil: none).
func spareOf(v *env, id string) *spare {
	v.e.pool.mu.Lock()
	ps := v.e.pool.spares[id]
	v.e.pool.mu.Unlock()
	if ps == nil {
		return nil
	}
	<-ps.done
	return ps.s
}

// TestFirstExecThroughSpare: the first exec of a container runs in its
// spare (spare.go: made while idle in the pool, or since a cold start),
// and sees exactly what the init's exec and runc exec give a process:
// environment, HOME, directory, capabilities, seccomp, cgroup (an exec
// cgroup of its own), rlimits, umask, fds, a killable OOM score, the
// attempt's root; its stdio and exit status are the exec's.
func TestFirstExecThroughSpare(t *testing.T) { coldAndPooled(t, testFirstExecThroughSpare) }

func testFirstExecThroughSpare(t *testing.T, opts Options) {
	v := newEnvWith(t, opts)
	const probe = `env | grep -v '^PPID=' | sort; echo "home=$HOME"; cat /proc/self/oom_score_adj; ls /proc/self/fd; ` +
		`grep -E '^(Cap|NoNewPrivs|Seccomp|Groups|Uid|Gid)' /proc/self/status; umask; ulimit -a; ` +
		`sed 's/exec-[0-9]*/exec-N/' /proc/self/cgroup; id; pwd; echo ppid=$PPID; ls /; cat; echo err >&2; exit 3`
	spec := executor.Spec{Env: []string{"WHO=attempt"}, Workdir: "/tmp", Limits: executor.Limits{Pids: 64, MemoryBytes: 64 << 20}}
	v.start("sp", spec)
	sp := spareOf(v, "sp")
	if sp == nil {
		t.Fatal("the container has no spare")
	}
	sparePid := sp.pid
	var pids []int
	run := func() string {
		t.Helper()
		var out, errb syncBuffer
		p, err := v.e.Exec(v.ctx, "sp", executor.ExecSpec{Args: []string{"sh", "-c", probe}, Env: []string{"X=1"}, Stdin: true, Stdout: &out, Stderr: &errb})
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, p.Pid())
		if _, err := io.WriteString(p.Stdin(), "input\n"); err != nil {
			t.Fatal(err)
		}
		p.Stdin().Close()
		if code, err := p.Wait(); err != nil || code != 3 || errb.String() != "err\n" {
			t.Fatalf("exec: code %d, err %v, stderr %q", code, err, errb.String())
		}
		return out.String()
	}
	viaSpare := run()
	if hasSpare(v, "sp") || pids[0] != sparePid {
		t.Fatalf("the first exec ran as %d, the spare was %d (still there: %v)", pids[0], sparePid, hasSpare(v, "sp"))
	}
	viaInit := run()
	v.e.noAgent = true
	viaRunc := run()
	v.e.noAgent = false
	if viaSpare != viaInit {
		t.Errorf("the spare's exec differs from the init's:\n--- spare\n%s\n--- init\n%s", viaSpare, viaInit)
	}
	// runc exec's parent is outside the pid namespace.
	if want := strings.Replace(viaRunc, "ppid=0\n", "ppid=1\n", 1); viaSpare != want {
		t.Errorf("the spare's exec differs from runc exec's:\n--- spare\n%s\n--- runc\n%s", viaSpare, viaRunc)
	}
	for _, s := range []string{"WHO=attempt\n", "X=1\n", "/tmp\nppid=1\n", "input\n", "exec-N"} {
		if !strings.Contains(viaSpare, s) {
			t.Errorf("the spare's exec misses %q:\n%s", s, viaSpare)
		}
	}
}

// TestPool_SpareFirstExecFailures: a first exec the spare cannot or must
// not run (a terminal, another user) discards it and runs as without one;
// one that fails (no such directory, no such command) fails as without
// one; a cancelled one is killed with everything it started; the next
// exec runs either way, through the init.
func TestPool_SpareFirstExecFailures(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 1})
	seq := 0
	fresh := func() string {
		seq++
		id := fmt.Sprintf("f%d", seq)
		v.start(id, executor.Spec{})
		if !hasSpare(v, id) {
			t.Fatalf("%s: no spare", id)
		}
		return id
	}
	next := func(id string) {
		t.Helper()
		if hasSpare(v, id) {
			t.Errorf("%s: the spare outlived the first exec", id)
		}
		if got := strings.TrimSpace(v.sh(t, id, "echo $PPID")); got != "1" {
			t.Errorf("%s: the next exec's parent is %s, want the init", id, got)
		}
	}

	id := fresh()
	r := v.run(v.ctx, id, executor.ExecSpec{TTY: true}, "sh", "-c", "echo $PPID")
	if r.err != nil || strings.TrimSpace(strings.ReplaceAll(r.stdout, "\r", "")) != "0" {
		t.Errorf("first exec on a terminal: %q %v, want runc exec's parent 0", r.stdout, r.err)
	}
	next(id)

	id = fresh()
	r = v.run(v.ctx, id, executor.ExecSpec{User: &executor.User{UID: 1000, GID: 1000}}, "id", "-u")
	if r.err != nil || r.stdout != "1000\n" {
		t.Errorf("first exec as another user: %q %v", r.stdout, r.err)
	}
	next(id)

	id = fresh()
	r = v.run(v.ctx, id, executor.ExecSpec{Workdir: "/nonexistent"}, "true")
	want := v.run(v.ctx, id, executor.ExecSpec{Workdir: "/nonexistent"}, "true")
	if r.err == nil || !isClass(r.err, executor.ErrInvalidArgument) || !isClass(want.err, executor.ErrInvalidArgument) {
		t.Errorf("first exec in a missing directory: %v; without a spare: %v; want invalid argument both", r.err, want.err)
	}
	next(id)

	id = fresh()
	r = v.run(v.ctx, id, executor.ExecSpec{}, "no-such-command")
	want = v.run(v.ctx, id, executor.ExecSpec{}, "no-such-command")
	if r.err == nil || !isClass(r.err, executor.ErrInvalidArgument) || !isClass(want.err, executor.ErrInvalidArgument) {
		t.Errorf("first exec of a missing command: %v; without a spare: %v; want invalid argument both", r.err, want.err)
	}
	next(id)

	id = fresh()
	ctx, expire := withExpiry(v.ctx)
	defer expire()
	var out syncBuffer
	p, err := v.e.Exec(ctx, id, executor.ExecSpec{Args: []string{"sh", "-c", "setsid sleep 1000 & sleep 1000 & echo started; wait"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "started")
	expire()
	if code, err := p.Wait(); !errors.Is(err, context.DeadlineExceeded) || code != 128+9 {
		t.Errorf("cancelled first exec: %d %v, want 137 and deadline exceeded", code, err)
	}
	if ps := v.containerPids(t, id); len(ps) != 1 {
		t.Errorf("after the kill the container holds %d processes, want the init alone: %+v", len(ps), ps)
	}
	next(id)
}

// TestSpareOfAFrozenContainer: a container frozen right after its cold
// start, its spare perhaps still under way, refuses an exec as frozen
// and stops without waiting for the spare (the command timeout here is
// an hour: a wait would hang the test); after Thaw execs run.
func TestSpareOfAFrozenContainer(t *testing.T) {
	v := newEnvWith(t, Options{CommandTimeout: time.Hour})
	for _, id := range []string{"fz1", "fz2"} {
		v.start(id, executor.Spec{})
		if err := v.e.Freeze(v.ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if r := v.run(v.ctx, "fz1", executor.ExecSpec{}, "true"); !isClass(r.err, executor.ErrFailedPrecondition) {
		t.Errorf("exec in a frozen container: %v, want failed precondition", r.err)
	}
	if err := v.e.Thaw(v.ctx, "fz1"); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(v.sh(t, "fz1", "echo $PPID")); got != "1" {
		t.Errorf("exec after Thaw: parent %s, want the init", got)
	}
	if err := v.e.Stop(v.ctx, "fz2"); err != nil {
		t.Fatal(err)
	}
}

// TestSpareHandoverHonorsContext: a first exec whose spare does not
// answer ends when its ctx does, not after the command timeout (an hour
// here), and leaves the container holding its init alone. The spare is
// stopped, as a process of the sandbox may stop it (a concurrent exec
// sees it while a cold start's spare is handed over) or a freeze may
// catch it after the exec's frozen check.
func TestSpareHandoverHonorsContext(t *testing.T) {
	coldAndPooled(t, testSpareHandoverHonorsContext)
}

func testSpareHandoverHonorsContext(t *testing.T, opts Options) {
	opts.CommandTimeout = time.Hour
	v := newEnvWith(t, opts)
	v.start("hs", executor.Spec{})
	sp := spareOf(v, "hs")
	if sp == nil {
		t.Fatal("the container has no spare")
	}
	if err := unix.Kill(sp.pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, expire := withExpiry(v.ctx)
	defer expire()
	type outcome struct {
		p   executor.Process
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		p, err := v.e.Exec(ctx, "hs", executor.ExecSpec{Args: []string{"true"}})
		done <- outcome{p, err}
	}()
	// Once the exec took the spare it is in the handover (or about to be).
	deadline := time.Now().Add(time.Minute)
	for hasSpare(v, "hs") {
		if time.Now().After(deadline) {
			t.Fatal("the exec never took the spare")
		}
		time.Sleep(time.Millisecond)
	}
	expire()
	var r outcome
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		// The Stop of the cleanup ends the exec (its init goes).
		t.Fatal("the exec outlived its context by a minute: it waits for the stopped spare")
	}
	if r.err == nil {
		r.p.Wait()
		t.Fatal("the exec started after its context ended")
	}
	if !errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("exec: %v, want deadline exceeded", r.err)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		var live []procStat
		for _, ps := range v.containerPids(t, "hs") {
			if ps.state != 'Z' {
				live = append(live, ps)
			}
		}
		if len(live) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container holds %d processes, want the init alone: %+v", len(live), live)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := strings.TrimSpace(v.sh(t, "hs", "echo $PPID")); got != "1" {
		t.Errorf("the next exec's parent is %s, want the init", got)
	}
}

// TestSpareDiscardRemovesItsCgroup: a spare that serves no exec (the
// first one wants a terminal; the container is frozen) goes with its
// exec cgroup once it has exited, not only at the container's Stop.
func TestSpareDiscardRemovesItsCgroup(t *testing.T) {
	v := newEnvWith(t, Options{})
	gone := func(dir string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the discarded spare's cgroup %s is still there", dir)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	v.start("tty", executor.Spec{})
	sp := spareOf(v, "tty")
	if sp == nil || sp.cg == nil {
		t.Fatal("the container has no spare")
	}
	if r := v.run(v.ctx, "tty", executor.ExecSpec{TTY: true}, "true"); r.err != nil || r.code != 0 {
		t.Fatalf("exec on a terminal: %d %v", r.code, r.err)
	}
	gone(sp.cg.dir)

	v.start("fz", executor.Spec{})
	sp = spareOf(v, "fz")
	if sp == nil || sp.cg == nil {
		t.Fatal("the container has no spare")
	}
	if err := v.e.Freeze(v.ctx, "fz"); err != nil {
		t.Fatal(err)
	}
	if r := v.run(v.ctx, "fz", executor.ExecSpec{}, "true"); !isClass(r.err, executor.ErrFailedPrecondition) {
		t.Errorf("exec in a frozen container: %v, want failed precondition", r.err)
	}
	if err := v.e.Thaw(v.ctx, "fz"); err != nil {
		t.Fatal(err)
	}
	gone(sp.cg.dir)
}
