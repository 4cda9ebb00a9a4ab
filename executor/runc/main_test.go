package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/internal/testenv"
)

// Tests here run real containers: they need root, runc and busybox-static,
// and skip with the reason elsewhere (fail under ESF_TEST_REQUIRE, see
// internal/testenv). Every test uses its own runc --root
// and state dir under t.TempDir, never /run/runc.

var (
	skipReason string // why real containers cannot run here
	initPath   string // executor/init, built once for the whole run
)

const testNamespace = "esf-test"

var envSeq atomic.Int64

func TestMain(m *testing.M) {
	code := func() int {
		if err := runctest.Check(); err != nil {
			skipReason = err.Error()
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "esf-init-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if initPath, err = runctest.BuildInit(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		code := m.Run()
		if code == 0 {
			if leak := leakedGoroutines(); leak != "" {
				fmt.Fprintf(os.Stderr, "goroutines of the executor outlived their calls:\n%s\n", leak)
				code = 1
			}
		}
		return code
	}()
	os.Exit(code)
}

// leakedGoroutines returns the stacks of goroutines still running code of
// this package (the test's own goroutines have ended by now).
func leakedGoroutines() string {
	var leak string
	for range 50 {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		leak = ""
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "esf/executor/runc.") && !strings.Contains(g, "leakedGoroutines") && !strings.Contains(g, "TestMain") {
				leak += g + "\n\n"
			}
		}
		if leak == "" {
			return ""
		}
		time.Sleep(20 * time.Millisecond)
	}
	return leak
}

// env is one executor with its own state dir and a busybox rootfs.
type env struct {
	t      *testing.T
	e      *Executor
	dir    string
	rootfs string
	ctx    context.Context

	mu    sync.Mutex
	ids   []string
	roots []string

	pooled bool // Options.PoolSize: every poolable start must adopt
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, Options{})
}

// newEnvWith is newEnv with options (StateDir, Init and Namespace are the
// env's). With a user namespace, the rootfs is chowned into its range, as
// an idmapped delta shows it.
func newEnvWith(t *testing.T, opts Options) *env {
	t.Helper()
	if skipReason != "" {
		testenv.Require(t, runctest.Needs...) // skips, or fails in CI
		t.Fatal(skipReason)
	}
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	if err := runctest.Busybox(rootfs); err != nil {
		t.Fatal(err)
	}
	// A namespace (cgroup parent) per env keeps tests that run in
	// parallel and reuse ids apart, in this test process and in others
	// running this package at the same time (another checkout's): with
	// the sequence alone, two processes' "esf-test-5/pt" were one cgroup.
	ns := fmt.Sprintf("%s-%d-%d", testNamespace, os.Getpid(), envSeq.Add(1))
	if r := opts.UserNS; r.Count > 0 {
		if err := chownTree(rootfs, int(r.Start)); err != nil {
			t.Fatal(err)
		}
	}
	opts.StateDir, opts.Init, opts.Namespace = filepath.Join(dir, "state"), initPath, ns
	e, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	v := &env{t: t, e: e, dir: dir, rootfs: rootfs, ctx: context.Background(), roots: []string{rootfs}, pooled: opts.PoolSize > 0}
	// Registered first, so it runs after the test's own cleanups.
	t.Cleanup(func() {
		v.checkClean()
		runctest.RemoveCgroupParents(ns)
	})
	if v.pooled {
		t.Cleanup(func() {
			if err := e.ClosePool(context.Background()); err != nil {
				t.Errorf("close pool: %v", err)
			}
		})
	}
	return v
}

// start starts a container with spec (Rootfs defaults to the env's) and
// stops it when the test ends.
func (v *env) start(id string, spec executor.Spec) {
	v.t.Helper()
	if spec.Rootfs == "" {
		spec.Rootfs = v.rootfs
	}
	adopt := v.pooled && poolable(spec)
	var before int
	if adopt {
		v.waitIdle()
		v.e.pool.mu.Lock()
		before = v.e.pool.adopted
		v.e.pool.mu.Unlock()
	}
	if err := v.e.Start(v.ctx, id, spec); err != nil {
		v.t.Fatalf("start %s: %v", id, err)
	}
	if adopt {
		v.e.pool.mu.Lock()
		after := v.e.pool.adopted
		v.e.pool.mu.Unlock()
		if after != before+1 {
			v.t.Fatalf("start %s: not adopted from the pool", id)
		}
	}
	v.mu.Lock()
	v.ids = append(v.ids, id)
	v.roots = append(v.roots, spec.Rootfs)
	v.mu.Unlock()
	v.t.Cleanup(func() {
		if err := v.e.Stop(context.Background(), id); err != nil {
			v.t.Errorf("stop %s: %v", id, err)
		}
	})
}

// waitIdle waits until the pool has an idle container.
func (v *env) waitIdle() {
	v.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for v.e.PoolIdle() == 0 {
		if time.Now().After(deadline) {
			v.t.Fatal("the pool never had an idle container")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// coldAndPooled runs test with containers started cold, then adopted from
// a pool: the sandbox's boundary is the same either way.
func coldAndPooled(t *testing.T, test func(t *testing.T, opts Options)) {
	t.Run("cold", func(t *testing.T) { test(t, Options{}) })
	t.Run("pooled", func(t *testing.T) { test(t, Options{PoolSize: 1}) })
}

// checkClean proves the executor left nothing: no container in runc's
// root, no bundle, no process inside the rootfs, no cgroup.
func (v *env) checkClean() {
	t := v.t
	ctx := context.Background()
	cs, err := v.e.rc.List(ctx)
	if err != nil {
		t.Errorf("runc list: %v", err)
	}
	for _, c := range cs {
		t.Errorf("runc list after the test: %s is %s", c.ID, c.Status)
		v.e.Stop(ctx, c.ID)
	}
	if ents, err := os.ReadDir(v.e.bundles); err != nil || len(ents) != 0 {
		t.Errorf("bundles left: %v %v", ents, err)
	}
	if ents, err := os.ReadDir(filepath.Join(v.e.opts.StateDir, stubsDir)); err != nil || len(ents) != 0 {
		t.Errorf("pool stubs left: %v %v", ents, err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if pids := processesIn(v.roots); len(pids) != 0 {
		t.Errorf("processes left in the containers' roots: %v", pids)
	}
	for _, id := range v.ids {
		for _, d := range cgroupDirs(v.e.opts.Namespace, id) {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("cgroup left: %s", d)
			}
		}
	}
}

// processesIn lists host processes whose root directory is one of roots:
// the processes of containers on them. (readlink of /proc/<pid>/root says
// "/" across mount namespaces, so the test compares device and inode.)
func processesIn(roots []string) []int {
	type key struct{ dev, ino uint64 }
	want := map[key]bool{}
	for _, r := range roots {
		var st unix.Stat_t
		if unix.Stat(r, &st) == nil {
			want[key{st.Dev, st.Ino}] = true
		}
	}
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/proc", d.Name(), "root"), &st) == nil && want[key{st.Dev, st.Ino}] {
			out = append(out, pid)
		}
	}
	return out
}

// cgroupDirs are where a container's cgroup would be, v1 and v2.
func cgroupDirs(ns, id string) []string {
	var out []string
	for _, h := range []string{"pids", "memory", "cpu", "freezer", ""} {
		out = append(out, filepath.Join("/sys/fs/cgroup", h, ns, id))
	}
	return out
}

// result is what one exec produced.
type result struct {
	stdout, stderr string
	code           int
	err            error
}

// run execs x (with Args) in id, waits, and returns its output.
func (v *env) run(ctx context.Context, id string, x executor.ExecSpec, args ...string) result {
	v.t.Helper()
	var out, errb syncBuffer
	x.Args = args
	x.Stdout, x.Stderr = &out, &errb
	p, err := v.e.Exec(ctx, id, x)
	if err != nil {
		return result{code: -1, err: err}
	}
	code, err := p.Wait()
	return result{stdout: out.String(), stderr: errb.String(), code: code, err: err}
}

// sh runs a shell command with default settings and fails the test unless
// it exits 0.
func (v *env) sh(t *testing.T, id, script string) string {
	t.Helper()
	r := v.run(v.ctx, id, executor.ExecSpec{}, "sh", "-c", script)
	if r.err != nil || r.code != 0 {
		t.Fatalf("sh -c %q: code %d, err %v, stderr %q", script, r.code, r.err, r.stderr)
	}
	return r.stdout
}

// syncBuffer is a bytes.Buffer safe for a pump and a test reading it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls until s contains want.
func (s *syncBuffer) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(s.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output never contained %q; got %q", want, s.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expiring is a context that times out (Err is context.DeadlineExceeded)
// when the test calls expire: a timeout that fires once the command got
// where the test needs it, which no fixed duration promises on a loaded
// machine.
type expiring struct{ context.Context }

func (e expiring) Err() error {
	if e.Context.Err() != nil {
		return context.DeadlineExceeded
	}
	return nil
}

func withExpiry(parent context.Context) (ctx context.Context, expire func()) {
	c, cancel := context.WithCancel(parent)
	return expiring{c}, cancel
}

// containerPids lists the container's processes as the cgroup has them.
func (v *env) containerPids(t *testing.T, id string) []procStat {
	t.Helper()
	pids, err := v.e.rc.Ps(v.ctx, v.e.runcID(id))
	if err != nil {
		t.Fatalf("runc ps: %v", err)
	}
	var out []procStat
	for _, p := range pids {
		if st, err := readStat(p); err == nil {
			out = append(out, st)
		}
	}
	return out
}

func isClass(err, class error) bool { return errors.Is(err, class) }

// chownTree shifts every owner under dir by base (ids 0.. become base..).
func chownTree(dir string, base int) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		return unix.Lchown(p, base+int(st.Uid), base+int(st.Gid))
	})
}
