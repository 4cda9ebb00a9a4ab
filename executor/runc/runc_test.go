package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc/runctest"
)

// TestFR09_BusyboxRootfsExecFreezeRestart: an image with nothing but
// busybox runs execs, freezes for a seal and thaws, stops without a trace,
// and a new container on the same rootfs sees what the first one wrote.
func TestFR09_BusyboxRootfsExecFreezeRestart(t *testing.T) {
	v := newEnv(t)
	v.start("fr09-a", executor.Spec{})

	if got := v.sh(t, "fr09-a", "echo hello > /tmp/hello; cat /tmp/hello; cat /proc/1/cmdline"); got != "hello\n/.esf/init\x00" {
		t.Fatalf("exec output %q", got)
	}
	// A writer in the background proves that Freeze stops processes, not
	// just execs: its file stops growing while frozen.
	v.sh(t, "fr09-a", "(while :; do echo x >> /tmp/ticks; sleep 0.01; done) >/dev/null 2>&1 &")
	ticks := filepath.Join(v.rootfs, "tmp", "ticks")
	size := func() int64 {
		fi, err := os.Stat(ticks)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	// grows waits for the file to grow: a loaded machine may leave the
	// writer unscheduled for a while, so a fixed window cannot say it
	// runs (the frozen check below, that it does not grow, can use one).
	grows := func() bool {
		a := size()
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
			if size() > a {
				return true
			}
		}
		return false
	}
	if !grows() {
		t.Fatal("background writer is not running")
	}

	if err := v.e.Freeze(v.ctx, "fr09-a"); err != nil {
		t.Fatal(err)
	}
	if err := v.e.Freeze(v.ctx, "fr09-a"); err != nil {
		t.Fatalf("second freeze: %v", err)
	}
	if info, err := v.e.State(v.ctx, "fr09-a"); err != nil || info.Status != executor.StatusPaused {
		t.Fatalf("state while frozen: %+v %v", info, err)
	}
	before := size()
	time.Sleep(200 * time.Millisecond)
	if size() != before {
		t.Fatal("the rootfs changed while the container was frozen")
	}
	r := v.run(v.ctx, "fr09-a", executor.ExecSpec{}, "true")
	if !isClass(r.err, executor.ErrFailedPrecondition) {
		t.Fatalf("exec into a frozen container: %v, want failed precondition", r.err)
	}
	if err := v.e.Thaw(v.ctx, "fr09-a"); err != nil {
		t.Fatal(err)
	}
	if err := v.e.Thaw(v.ctx, "fr09-a"); err != nil {
		t.Fatalf("second thaw: %v", err)
	}
	if !grows() {
		t.Fatal("the background writer did not resume after thaw")
	}

	// The leak check of every test relies on seeing a container's
	// processes by their root; make sure it does.
	if pids := processesIn([]string{v.rootfs}); len(pids) < 2 {
		t.Fatalf("processesIn sees %v in a container running init and a writer", pids)
	}
	if err := v.e.Stop(v.ctx, "fr09-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.e.State(v.ctx, "fr09-a"); !isClass(err, executor.ErrNotFound) {
		t.Fatalf("state after stop: %v, want not found", err)
	}
	if grows() {
		t.Fatal("a process outlived Stop")
	}
	// The image had no /proc, /dev, /sys, /run or /.esf; Stop removed the
	// mountpoints runc made, so only the sandbox's writes remain.
	for _, p := range executor.Footprint() {
		if _, err := os.Lstat(filepath.Join(v.rootfs, p)); err == nil {
			t.Errorf("footprint %s left in the rootfs", p)
		}
	}

	v.start("fr09-b", executor.Spec{})
	if got := v.sh(t, "fr09-b", "cat /tmp/hello"); got != "hello\n" {
		t.Fatalf("restart sees %q", got)
	}
}

// TestAdoptAfterRestart: a second Executor on the same state dir (a
// restarted daemon) finds the container, execs into it and stops it; a
// half-made start shows up as absent and Stop removes it.
func TestAdoptAfterRestart(t *testing.T) {
	v := newEnv(t)
	v.start("att_one", executor.Spec{Workdir: "/tmp"})
	v.sh(t, "att_one", "echo before > /tmp/f")

	e2, err := New(v.e.opts)
	if err != nil {
		t.Fatal(err)
	}
	// A crash between the bundle and runc run leaves a bundle only.
	half := filepath.Join(v.e.bundles, "att_half")
	if err := os.Mkdir(half, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(half, "config.json"), map[string]any{"root": map[string]string{"path": v.rootfs}}); err != nil {
		t.Fatal(err)
	}

	list, err := e2.List(v.ctx, "att_")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != "att_half" || list[0].Status != executor.StatusAbsent ||
		list[1].ID != "att_one" || list[1].Status != executor.StatusRunning || list[1].Rootfs != v.rootfs || list[1].Pid == 0 {
		t.Fatalf("list after restart: %+v", list)
	}
	if other, err := e2.List(v.ctx, "zzz"); err != nil || len(other) != 0 {
		t.Fatalf("list with a foreign prefix: %+v %v", other, err)
	}

	var out syncBuffer
	p, err := e2.Exec(v.ctx, "att_one", executor.ExecSpec{Args: []string{"sh", "-c", "pwd; cat f"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 0 || err != nil || out.String() != "/tmp\nbefore\n" {
		t.Fatalf("exec after restart: %d %v %q", code, err, out.String())
	}
	if err := e2.Stop(v.ctx, "att_half"); err != nil {
		t.Fatal(err)
	}
	if err := e2.Stop(v.ctx, "att_one"); err != nil {
		t.Fatal(err)
	}
	if list, err := e2.List(v.ctx, ""); err != nil || len(list) != 0 {
		t.Fatalf("list after stops: %+v %v", list, err)
	}
	if err := e2.Stop(v.ctx, "att_never"); err != nil {
		t.Fatalf("stop of an unknown id: %v", err)
	}
}

// TestStartErrors: refusals leave nothing behind, including a start that
// runc itself fails half way.
func TestStartErrors(t *testing.T) {
	v := newEnv(t)
	for _, tc := range []struct {
		name string
		id   string
		spec executor.Spec
		want error
	}{
		{"bad id", "a/b", executor.Spec{Rootfs: v.rootfs}, executor.ErrInvalidArgument},
		{"dot id", "..", executor.Spec{Rootfs: v.rootfs}, executor.ErrInvalidArgument},
		{"relative rootfs", "x", executor.Spec{Rootfs: "rootfs"}, executor.ErrInvalidArgument},
		{"missing rootfs", "x", executor.Spec{Rootfs: filepath.Join(v.dir, "nope")}, executor.ErrInvalidArgument},
		{"missing mount source", "x", executor.Spec{Rootfs: v.rootfs, Mounts: []executor.Mount{{Source: "/nonexistent", Destination: "/m"}}}, executor.ErrInvalidArgument},
		{"mount over init", "x", executor.Spec{Rootfs: v.rootfs, Mounts: []executor.Mount{{Source: v.dir, Destination: "/.esf/init"}}}, executor.ErrInvalidArgument},
		{"bad env", "x", executor.Spec{Rootfs: v.rootfs, Env: []string{"NOEQUALS"}}, executor.ErrInvalidArgument},
		{"negative memory", "x", executor.Spec{Rootfs: v.rootfs, Limits: executor.Limits{MemoryBytes: -1}}, executor.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := v.e.Start(v.ctx, tc.id, tc.spec); !isClass(err, tc.want) {
				t.Fatalf("start: %v, want %v", err, tc.want)
			}
		})
	}

	// runc fails to mount a directory over a file: the bundle, the
	// container and the footprint must all be gone afterwards.
	err := v.e.Start(v.ctx, "bad-mount", executor.Spec{Rootfs: v.rootfs,
		Mounts: []executor.Mount{{Source: v.dir, Destination: "/bin/busybox"}}})
	if err == nil {
		v.e.Stop(v.ctx, "bad-mount")
		t.Fatal("start with a directory mounted over a file succeeded")
	}
	if !strings.Contains(err.Error(), "runc run") {
		t.Errorf("error does not say runc failed: %v", err)
	}
	for _, p := range executor.Footprint() {
		if _, err := os.Lstat(filepath.Join(v.rootfs, p)); err == nil {
			t.Errorf("failed start left %s in the rootfs", p)
		}
	}

	ctx, cancel := context.WithCancel(v.ctx)
	cancel()
	if err := v.e.Start(ctx, "cancelled", executor.Spec{Rootfs: v.rootfs}); !isClass(err, context.Canceled) {
		t.Fatalf("start with a cancelled context: %v", err)
	}

	v.start("dup", executor.Spec{})
	if err := v.e.Start(v.ctx, "dup", executor.Spec{Rootfs: v.rootfs}); !isClass(err, executor.ErrExists) {
		t.Fatalf("second start: %v, want exists", err)
	}
	if err := v.e.Freeze(v.ctx, "nope"); !isClass(err, executor.ErrNotFound) {
		t.Fatalf("freeze of an unknown id: %v", err)
	}
	if _, err := v.e.Exec(v.ctx, "nope", executor.ExecSpec{Args: []string{"true"}}); !isClass(err, executor.ErrNotFound) {
		t.Fatalf("exec into an unknown id: %v", err)
	}
}

// TestInit: the init is PID 1, reaps orphans (no zombie survives), and
// ends the container on SIGTERM.
func TestInit(t *testing.T) {
	t.Parallel() // mostly sleeps
	v := newEnv(t)
	v.start("init", executor.Spec{})
	// The subshell exits at once, so its sleeps are reparented to PID 1;
	// each one that ends is a zombie until init waits for it.
	v.sh(t, "init", "for i in 1 2 3 4 5; do (sleep 0.1 &) ; done")
	// Without reaping, the five zombies would stay forever.
	deadline := time.Now().Add(time.Minute)
	for {
		ps := v.containerPids(t, "init")
		if len(ps) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left beside init (zombies are state Z): %+v", ps)
		}
		time.Sleep(50 * time.Millisecond)
	}

	info, err := v.e.State(v.ctx, "init")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(info.Pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		info, err := v.e.State(v.ctx, "init")
		if err == nil && info.Status == executor.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container still %+v (%v) after SIGTERM to init", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := v.run(v.ctx, "init", executor.ExecSpec{}, "true")
	if !isClass(r.err, executor.ErrFailedPrecondition) {
		t.Fatalf("exec into a stopped container: %v", r.err)
	}
}

// TestConcurrentContainers: several containers on their own rootfses
// start, exec and stop at once.
func TestConcurrentContainers(t *testing.T) {
	v := newEnv(t)
	const n = 4
	errs := make(chan error, n)
	for i := range n {
		go func() {
			id := "c" + strconv.Itoa(i)
			rootfs := filepath.Join(v.dir, id)
			v.mu.Lock()
			v.roots = append(v.roots, rootfs)
			v.mu.Unlock()
			if err := runctest.Busybox(rootfs); err != nil {
				errs <- err
				return
			}
			if err := v.e.Start(v.ctx, id, executor.Spec{Rootfs: rootfs}); err != nil {
				errs <- err
				return
			}
			var out syncBuffer
			p, err := v.e.Exec(v.ctx, id, executor.ExecSpec{Args: []string{"sh", "-c", "echo " + id}, Stdout: &out})
			if err == nil {
				_, err = p.Wait()
			}
			if err == nil && out.String() != id+"\n" {
				err = fmt.Errorf("%s printed %q", id, out.String())
			}
			if serr := v.e.Stop(context.Background(), id); err == nil {
				err = serr
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestStopEndsExecs: Stop of a running and of a frozen container ends the
// execs in it; their Wait returns 137 and nothing is left.
func TestStopEndsExecs(t *testing.T) {
	t.Parallel() // mostly sleeps
	for _, frozen := range []bool{false, true} {
		t.Run(fmt.Sprintf("frozen=%v", frozen), func(t *testing.T) {
			v := newEnv(t)
			v.start("stop", executor.Spec{})
			var out syncBuffer
			p, err := v.e.Exec(v.ctx, "stop", executor.ExecSpec{Args: []string{"sh", "-c", "echo up; sleep 1000"}, Stdout: &out, Stdin: true})
			if err != nil {
				t.Fatal(err)
			}
			out.waitFor(t, "up")
			if frozen {
				if err := v.e.Freeze(v.ctx, "stop"); err != nil {
					t.Fatal(err)
				}
			}
			if err := v.e.Stop(v.ctx, "stop"); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			var code int
			go func() {
				code, err = p.Wait()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("Wait did not return after Stop")
			}
			if code != 137 || err != nil {
				t.Fatalf("Wait after Stop: %d %v", code, err)
			}
		})
	}
}

// TestFreezeThroughCgroup: Freeze and Thaw write the cgroup's freezer
// themselves (no runc invocation); runc sees the result (State says
// paused), a second Freeze or Thaw is a no-op, and a container whose init
// died is refused as not running, as runc would.
func TestFreezeThroughCgroup(t *testing.T) {
	v := newEnv(t)
	v.start("fz", executor.Spec{})
	for range 2 {
		if err := v.e.Freeze(v.ctx, "fz"); err != nil {
			t.Fatal(err)
		}
	}
	if info, err := v.e.State(v.ctx, "fz"); err != nil || info.Status != executor.StatusPaused {
		t.Fatalf("state after freeze: %+v %v", info, err)
	}
	for range 2 {
		if err := v.e.Thaw(v.ctx, "fz"); err != nil {
			t.Fatal(err)
		}
	}
	if info, err := v.e.State(v.ctx, "fz"); err != nil || info.Status != executor.StatusRunning {
		t.Fatalf("state after thaw: %+v %v", info, err)
	}
	if got := v.sh(t, "fz", "echo alive"); got != "alive\n" {
		t.Fatalf("exec after thaw: %q", got)
	}

	if err := v.e.rc.Kill(v.ctx, "fz", int(unix.SIGKILL), nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := v.e.State(v.ctx, "fz")
		if err == nil && info.Status == executor.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container never stopped: %+v %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := v.e.Freeze(v.ctx, "fz"); !errors.Is(err, executor.ErrFailedPrecondition) {
		t.Errorf("freeze of a stopped container: %v, want failed precondition", err)
	}
	if err := v.e.Thaw(v.ctx, "fz"); !errors.Is(err, executor.ErrFailedPrecondition) {
		t.Errorf("thaw of a stopped container: %v, want failed precondition", err)
	}
}

// TestFreezeWhileExecing: a container busy forking and writing freezes
// (every task stops, repeatedly) and thaws back to work; the exec in
// flight survives both.
func TestFreezeWhileExecing(t *testing.T) {
	v := newEnv(t)
	v.start("fzx", executor.Spec{})
	ctx, cancel := context.WithCancel(v.ctx)
	defer cancel()
	var out syncBuffer
	p, err := v.e.Exec(ctx, "fzx", executor.ExecSpec{Args: []string{"sh", "-c",
		"i=0; (while :; do :; done) & while :; do i=$((i+1)); echo $i > /tmp/n; sh -c true; [ $i = 3 ] && echo started; done"},
		Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "started")
	counter := func() string {
		b, _ := os.ReadFile(filepath.Join(v.rootfs, "tmp/n"))
		return string(b)
	}
	for range 5 {
		if err := v.e.Freeze(v.ctx, "fzx"); err != nil {
			t.Fatal(err)
		}
		// Frozen means no task runs: the counter cannot move. (Reading
		// twice can only miss a bug, never invent one.)
		before := counter()
		time.Sleep(20 * time.Millisecond)
		if after := counter(); after != before {
			t.Fatalf("counter moved while frozen: %q -> %q", before, after)
		}
		if info, err := v.e.State(v.ctx, "fzx"); err != nil || info.Status != executor.StatusPaused {
			t.Fatalf("state while frozen: %+v %v", info, err)
		}
		if err := v.e.Thaw(v.ctx, "fzx"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for c := counter(); counter() == c; {
			if time.Now().After(deadline) {
				t.Fatal("no progress after thaw")
			}
			time.Sleep(time.Millisecond)
		}
	}
	cancel()
	if _, err := p.Wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("exec after the freezes: %v, want it cancelled by the test", err)
	}
}
