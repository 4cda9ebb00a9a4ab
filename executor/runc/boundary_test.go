package runc

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc/runctest"
)

// testUserNS is the id range boundary tests map containers to.
var testUserNS = IDRange{Start: 1 << 30, Count: 65536}

// hostIDs reads a process's real uid and gid as the host sees them.
func hostIDs(t *testing.T, pid int) (uid, gid int) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == "Uid:" {
			uid, _ = strconv.Atoi(f[1])
		}
		if len(f) > 1 && f[0] == "Gid:" {
			gid, _ = strconv.Atoi(f[1])
		}
	}
	return uid, gid
}

// TestBoundary_SetuidInSandboxNotRootOnHost: the container's root is an
// unprivileged host user. A setuid binary it makes is setuid to that user
// on the host, not to root; it cannot make device nodes or give files
// capabilities (CAP_MKNOD and CAP_SETFCAP dropped, and they would not
// reach the host through the user namespace anyway).
func TestBoundary_SetuidInSandboxNotRootOnHost(t *testing.T) {
	coldAndPooled(t, testBoundary_SetuidInSandboxNotRootOnHost)
}

func testBoundary_SetuidInSandboxNotRootOnHost(t *testing.T, opts Options) {
	opts.UserNS = testUserNS
	v := newEnvWith(t, opts)
	v.start("uns", executor.Spec{})
	if got := v.sh(t, "uns", "id -u; id -g"); got != "0\n0\n" {
		t.Fatalf("inside, root is %q, want 0 0", got)
	}
	info, err := v.e.State(v.ctx, "uns")
	if err != nil {
		t.Fatal(err)
	}
	if uid, gid := hostIDs(t, info.Pid); uid != int(testUserNS.Start) || gid != int(testUserNS.Start) {
		t.Fatalf("the init runs as host %d:%d, want %d (the range's first id)", uid, gid, testUserNS.Start)
	}
	v.sh(t, "uns", "cp /bin/busybox /suid && chmod 4755 /suid")
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(v.rootfs, "suid"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid == 0 || st.Uid != testUserNS.Start {
		t.Fatalf("a setuid file made by the sandbox's root is owned by host uid %d, want %d", st.Uid, testUserNS.Start)
	}
	caps := v.sh(t, "uns", "grep CapBnd /proc/self/status")
	bnd, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(caps, "CapBnd:")), 16, 64)
	if err != nil {
		t.Fatalf("CapBnd %q: %v", caps, err)
	}
	for _, c := range []uint{unix.CAP_FSETID, unix.CAP_MKNOD, unix.CAP_SETFCAP} {
		if bnd&(1<<c) != 0 {
			t.Errorf("capability %d is in the bounding set %x", c, bnd)
		}
	}
	if r := v.run(v.ctx, "uns", executor.ExecSpec{}, "mknod", "/blk", "b", "8", "0"); r.code == 0 {
		t.Errorf("mknod of a block device succeeded inside")
	}
	// A user of the container is a host id of the range too.
	u := executor.User{UID: 1000, GID: 1000}
	if r := v.run(v.ctx, "uns", executor.ExecSpec{User: &u}, "sh", "-c", "touch /tmp/u && id -u"); r.code != 0 || r.stdout != "1000\n" {
		t.Fatalf("exec as 1000: %+v", r)
	}
	if err := unix.Stat(filepath.Join(v.rootfs, "tmp/u"), &st); err != nil || st.Uid != testUserNS.Start+1000 {
		t.Fatalf("a file of the container's uid 1000 is owned by host %d (%v), want %d", st.Uid, err, testUserNS.Start+1000)
	}
	// Outside the range: refused, not run as some other host user.
	out := executor.User{UID: testUserNS.Count}
	if r := v.run(v.ctx, "uns", executor.ExecSpec{User: &out}, "true"); !isClass(r.err, executor.ErrInvalidArgument) {
		t.Fatalf("exec as a uid outside the range: %+v, want invalid argument", r)
	}
}

// TestBoundary_CapAddGivesBackMknod: a policy may give a dropped
// capability back, and only those.
func TestBoundary_CapAddGivesBackMknod(t *testing.T) {
	v := newEnv(t)
	if err := v.e.Start(v.ctx, "bad", executor.Spec{Rootfs: v.rootfs, CapAdd: []string{"CAP_SYS_ADMIN"}}); !isClass(err, executor.ErrInvalidArgument) {
		t.Fatalf("CapAdd CAP_SYS_ADMIN: %v, want invalid argument", err)
	}
	v.start("plain", executor.Spec{})
	if r := v.run(v.ctx, "plain", executor.ExecSpec{}, "mknod", "/dev/shm/n", "c", "1", "3"); r.code == 0 {
		t.Errorf("mknod succeeded without CAP_MKNOD")
	}
	root2 := filepath.Join(v.dir, "rootfs2")
	if err := os.Rename(v.rootfs, root2); err != nil {
		t.Fatal(err)
	}
	v.roots = append(v.roots, root2)
	v.start("mk", executor.Spec{Rootfs: root2, CapAdd: []string{"CAP_MKNOD"}})
	if r := v.run(v.ctx, "mk", executor.ExecSpec{}, "mknod", "/dev/shm/n", "c", "1", "3"); r.code != 0 {
		t.Errorf("mknod with CAP_MKNOD given back: %+v", r)
	}
}

// TestBoundary_PtraceInitFails: nothing in the sandbox can attach to its
// PID 1 (the init is undumpable and the sandbox has no CAP_SYS_PTRACE),
// so it cannot stop the init that serves every exec (finding 5).
func TestBoundary_PtraceInitFails(t *testing.T) { coldAndPooled(t, testBoundary_PtraceInitFails) }

func testBoundary_PtraceInitFails(t *testing.T, opts Options) {
	opts.UserNS = testUserNS
	v := newEnvWith(t, opts)
	tracer := filepath.Join(v.rootfs, "ptrace")
	cmd := exec.Command("go", "build", "-o", tracer, "./testdata/ptrace")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the tracer: %v: %s", err, out)
	}
	v.start("pt", executor.Spec{})
	// The tracer can attach to a process of its own kind: the check is
	// about the init, not about ptrace being off. The sibling is killed
	// with SIGKILL: if the attach caught it in its exec, the SIGSTOP can
	// outlive the detach, and a stopped sleep ignores SIGTERM and would
	// hold the exec's output (and the test) for good.
	if got := v.sh(t, "pt", "sleep 60 & p=$!; /ptrace $p; kill -KILL $p"); got != "attached\n" {
		t.Fatalf("attaching to a sibling: %q", got)
	}
	r := v.run(v.ctx, "pt", executor.ExecSpec{}, "/ptrace", "1")
	if r.code == 0 || strings.Contains(r.stdout, "attached") {
		t.Fatalf("attaching to the init: %+v", r)
	}
	// /proc/1/environ takes the same access check (ptrace_may_access).
	if r := v.run(v.ctx, "pt", executor.ExecSpec{}, "cat", "/proc/1/environ"); r.code == 0 {
		t.Fatalf("reading the init's environment succeeded: %+v", r)
	}
	// After all that, the init still serves execs.
	if got := v.sh(t, "pt", "echo alive"); got != "alive\n" {
		t.Fatalf("after the attempts: %q", got)
	}
}

// TestBoundary_TimeoutWithInitStopped: an exec in flight ends when its
// context does even if the init that started it is stopped and never
// reports the exit (finding 5: it used to wait for the lease).
func TestBoundary_TimeoutWithInitStopped(t *testing.T) {
	coldAndPooled(t, testBoundary_TimeoutWithInitStopped)
}

func testBoundary_TimeoutWithInitStopped(t *testing.T, opts Options) {
	v := newEnvWith(t, opts)
	v.start("stp", executor.Spec{})
	info, err := v.e.State(v.ctx, "stp")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(v.ctx)
	defer cancel()
	var out syncBuffer
	p, err := v.e.Exec(ctx, "stp", executor.ExecSpec{Args: []string{"sh", "-c", "echo started; exec sleep 1000"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "started")
	if err := unix.Kill(info.Pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Kill(info.Pid, unix.SIGCONT) })
	cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.Wait()
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("wait: %v, want the exec's cancellation", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the exec outlived its context by a minute with the init stopped")
	}
}

// TestBoundary_TimeoutKillsEscapedChildren: when an exec's context ends,
// a daemon it started that left both its session and its process tree
// (double fork, setsid: reparented to the init) dies with it, through
// the init and through runc exec alike. A daemon of an earlier exec that
// ended on its own lives on.
func TestBoundary_TimeoutKillsEscapedChildren(t *testing.T) {
	coldAndPooled(t, testBoundary_TimeoutKillsEscapedChildren)
}

func testBoundary_TimeoutKillsEscapedChildren(t *testing.T, opts Options) {
	v := newEnvWith(t, opts)
	v.start("esc", executor.Spec{})
	alive := func(arg string) bool {
		for _, p := range v.containerPids(t, "esc") {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/cmdline")
			if strings.Contains(string(b), arg) && p.state != 'Z' {
				return true
			}
		}
		return false
	}
	escape := func(n string) string {
		return "(setsid sh -c 'echo > /tmp/d" + n + "; exec sleep " + n + "' </dev/null >/dev/null 2>&1 &); " +
			"while [ ! -e /tmp/d" + n + " ]; do sleep 0.01; done; echo started; exec sleep 1000"
	}
	waitAlive := func(arg string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !alive(arg) {
			if time.Now().After(deadline) {
				t.Fatalf("%q never ran", arg)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// An earlier exec's daemon, left running when that exec ended.
	v.sh(t, "esc", "(setsid sh -c 'exec sleep 1999' </dev/null >/dev/null 2>&1 &)")
	waitAlive("sleep\x001999")
	for i, user := range []*executor.User{nil, {UID: 1000, GID: 1000}} {
		n := strconv.Itoa(2001 + i)
		ctx, cancel := context.WithCancel(v.ctx)
		var out syncBuffer
		p, err := v.e.Exec(ctx, "esc", executor.ExecSpec{Args: []string{"sh", "-c", escape(n)}, User: user, Stdout: &out})
		if err != nil {
			t.Fatal(err)
		}
		out.waitFor(t, "started")
		waitAlive("sleep\x00" + n)
		cancel()
		if _, err := p.Wait(); !errors.Is(err, context.Canceled) {
			t.Fatalf("exec %d: %v, want cancelled", i, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for alive("sleep\x00" + n) {
			if time.Now().After(deadline) {
				t.Fatalf("exec %d (user %v): its escaped daemon outlived the exec's kill", i, user)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !alive("sleep\x001999") {
		t.Fatal("an earlier exec's daemon was killed by a later exec's timeout")
	}
}

// TestUserNSRangesShareANamespace: two executors of one namespace with
// different ranges (two daemons on a host) run containers side by side,
// and an executor without a range (esfd stop-all) stops one of them,
// its rootfs bind included.
func TestUserNSRangesShareANamespace(t *testing.T) {
	v := newEnvWith(t, Options{UserNS: testUserNS})
	other := IDRange{Start: testUserNS.Start + testUserNS.Count, Count: testUserNS.Count}
	root2 := filepath.Join(v.dir, "rootfs2")
	if err := runctest.Busybox(root2); err != nil {
		t.Fatal(err)
	}
	if err := chownTree(root2, int(other.Start)); err != nil {
		t.Fatal(err)
	}
	e2, err := New(Options{StateDir: filepath.Join(v.dir, "state2"), Init: initPath, Namespace: v.e.opts.Namespace, UserNS: other})
	if err != nil {
		t.Fatal(err)
	}
	v.start("one", executor.Spec{})
	if err := e2.Start(v.ctx, "two", executor.Spec{Rootfs: root2}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e2.Stop(v.ctx, "two") })
	// The first executor starts another container after the second.
	root3 := filepath.Join(v.dir, "rootfs3")
	if err := runctest.Busybox(root3); err != nil {
		t.Fatal(err)
	}
	if err := chownTree(root3, int(testUserNS.Start)); err != nil {
		t.Fatal(err)
	}
	v.start("three", executor.Spec{Rootfs: root3})
	for _, id := range []string{"one", "three"} {
		if got := v.sh(t, id, "id -u"); got != "0\n" {
			t.Fatalf("%s: %q", id, got)
		}
	}
	bind := e2.userNSRootfs("two")
	stopper, err := New(Options{StateDir: filepath.Join(v.dir, "state2"), Init: initPath, Namespace: v.e.opts.Namespace})
	if err != nil {
		t.Fatal(err)
	}
	if err := stopper.Stop(v.ctx, "two"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(bind); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the rootfs bind %s is still there after a stop without the range: %v", bind, err)
	}
}
