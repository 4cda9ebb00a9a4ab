package runc

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc/runctest"
)

// The pool attacked: what an adopted container could see or keep of the
// pool's set-up, and what of the boundary could differ from a cold start.

// boundaryView is what the sandbox's boundary looks like from inside a
// container, through one exec: its credentials, seccomp and
// no-new-privileges, rlimits, the init's, and what of the host's
// paths shows in its mount table or its init. The container's id (in
// its cgroup path) and root path are replaced by placeholders.
const boundaryScript = `
for f in Uid Gid Groups CapInh CapPrm CapEff CapBnd CapAmb NoNewPrivs Seccomp Seccomp_filters; do grep "^$f:" /proc/self/status; done
echo ---limits; cat /proc/self/limits
echo ---oom $(cat /proc/self/oom_score_adj); echo umask $(umask)
echo ---init
for f in Uid Gid CapInh CapPrm CapEff CapBnd CapAmb NoNewPrivs Seccomp Seccomp_filters; do grep "^$f:" /proc/1/status; done
echo init oom $(cat /proc/1/oom_score_adj)
echo init cmdline $(tr '\0' ' ' < /proc/1/cmdline)
echo init cwd $(readlink /proc/1/cwd) root $(readlink /proc/1/root)
echo init fds $(ls /proc/1/fd 2>&1 | tr '\n' ' ')
echo ---cgroup; cat /proc/self/cgroup
echo ---root; ls -a / | tr '\n' ' '; echo
echo ---mountinfo roots; awk '{print $4, $5}' /proc/self/mountinfo | sort
echo ---hostname $(hostname)
`

var execCgroupName = regexp.MustCompile(`exec-[0-9]+`)

func boundaryView(t *testing.T, v *env, id string) string {
	t.Helper()
	out := v.sh(t, id, boundaryScript)
	out = strings.ReplaceAll(out, v.rootfs, "ROOT")
	out = strings.ReplaceAll(out, "/"+v.e.opts.Namespace+"/"+v.e.runcID(id), "/NS/ID")
	return execCgroupName.ReplaceAllString(out, "exec-N")
}

// cgroupConfig reads every setting of container id's cgroup, in each v1
// hierarchy (or v2): what runc would have written at its start, and what
// it left as the kernel's default. Counters, statistics and files that
// cannot be read are left out.
func cgroupConfig(t *testing.T, v *env, id string) map[string]string {
	t.Helper()
	var cs specs.Spec
	if err := readJSON(filepath.Join(v.e.bundle(id), "config.json"), &cs); err != nil {
		t.Fatal(err)
	}
	skip := []string{"usage", "stat", "events", "failcnt", "tasks", "procs", "current", "pressure",
		"slabinfo", "oom_control", "self_freezing", "parent_freezing", "cpuacct.", "cgroup.", "peak",
		"release_agent", "notify_on_release", "freezer.state", "cpu.idle"}
	out := map[string]string{}
	ctls, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{filepath.Join("/sys/fs/cgroup", cs.Linux.CgroupsPath)}
	for _, c := range ctls {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", c.Name(), cs.Linux.CgroupsPath))
	}
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, f := range ents {
			if f.IsDir() || slices.ContainsFunc(skip, func(s string) bool { return strings.Contains(f.Name(), s) }) {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, f.Name()))
			if err != nil {
				continue
			}
			// The hierarchy (v1) or "cgroup" (v2), and the file.
			ctl := filepath.Base(filepath.Dir(filepath.Dir(dir)))
			out[ctl+"/"+f.Name()] = strings.TrimSpace(string(b))
		}
	}
	if len(out) == 0 {
		t.Fatalf("no cgroup settings for %s at %s", id, cs.Linux.CgroupsPath)
	}
	return out
}

// initFds lists what the init of container id holds open, seen from the
// host: the kind of each descriptor (pipe, socket, anon inode) or its
// path; the root's path as ROOT.
func initFds(t *testing.T, v *env, id string) []string {
	t.Helper()
	info, err := v.e.State(v.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("/proc", strconv.Itoa(info.Pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range ents {
		l, err := os.Readlink(filepath.Join(dir, d.Name()))
		if err != nil {
			continue
		}
		if k, _, ok := strings.Cut(l, ":["); ok {
			l = k
		}
		out = append(out, d.Name()+" "+strings.ReplaceAll(l, v.rootfs, "ROOT"))
	}
	return out
}

// TestPool_SameBoundaryAsCold: a container adopted from the pool and one
// started cold on the same spec are the same seen from inside, field by
// field, through both ways an exec starts (the init, runc exec):
// credentials and capability sets, seccomp and its filter count,
// no-new-privileges, rlimits, OOM score, umask, the init's own status,
// open descriptors, root and working directory, the mount table with each
// mount's root (nothing of the pool's stub, its bundle or the adoption's
// mountpoint), and from the host every setting of their cgroups.
func TestPool_SameBoundaryAsCold(t *testing.T) {
	t.Run("host ids", func(t *testing.T) { testPoolSameBoundaryAsCold(t, Options{}) })
	t.Run("user namespace", func(t *testing.T) { testPoolSameBoundaryAsCold(t, Options{UserNS: testUserNS}) })
}

func testPoolSameBoundaryAsCold(t *testing.T, opts Options) {
	cold := newEnvWith(t, opts)
	opts.PoolSize = 1
	pooled := newEnvWith(t, opts)
	spec := executor.Spec{Limits: executor.Limits{MemoryBytes: 64 << 20, Pids: 64, CPUs: 0.5}}
	cold.start("att_b", spec)
	pooled.start("att_b", spec)

	for _, noAgent := range []bool{false, true} {
		cold.e.noAgent, pooled.e.noAgent = noAgent, noAgent
		want, got := boundaryView(t, cold, "att_b"), boundaryView(t, pooled, "att_b")
		if got != want {
			t.Errorf("runc exec %v: the pooled container sees\n%s\nthe cold one\n%s", noAgent, got, want)
		}
		for _, leak := range []string{adoptDir, stubsDir + "/", poolPrefix, pooled.e.opts.StateDir} {
			if strings.Contains(got, leak) {
				t.Errorf("runc exec %v: the pooled container sees %q:\n%s", noAgent, leak, got)
			}
		}
	}
	cold.e.noAgent, pooled.e.noAgent = false, false

	// From the host: the init's descriptors are the same kinds (none a
	// directory or file of the stub or the bundle), its root is the
	// attempt's.
	for _, v := range []*env{cold, pooled} {
		if pids := processesIn([]string{v.rootfs}); len(pids) != 1 {
			t.Errorf("processes rooted in the attempt's root: %v, want the init", pids)
		}
	}
	if w, g := initFds(t, cold, "att_b"), initFds(t, pooled, "att_b"); !slices.Equal(w, g) {
		t.Errorf("the init's descriptors: pooled %q, cold %q", g, w)
	}

	w, g := cgroupConfig(t, cold, "att_b"), cgroupConfig(t, pooled, "att_b")
	t.Logf("%d cgroup settings compared", len(w))
	for k, wv := range w {
		if gv, ok := g[k]; !ok || gv != wv {
			t.Errorf("cgroup %s: pooled %q, cold %q", k, gv, wv)
		}
	}
	for k, gv := range g {
		if _, ok := w[k]; !ok {
			t.Errorf("cgroup %s: pooled %q, cold has none", k, gv)
		}
	}
}

// startAny starts container id like start, adopted or not, and stops it
// when the test ends.
func (v *env) startAny(t *testing.T, id string, spec executor.Spec) error {
	t.Helper()
	if spec.Rootfs == "" {
		spec.Rootfs = v.rootfs
	}
	if err := v.e.Start(v.ctx, id, spec); err != nil {
		return err
	}
	v.mu.Lock()
	v.ids = append(v.ids, id)
	v.roots = append(v.roots, spec.Rootfs)
	v.mu.Unlock()
	t.Cleanup(func() {
		if err := v.e.Stop(context.Background(), id); err != nil {
			t.Errorf("stop %s: %v", id, err)
		}
	})
	return nil
}

func (v *env) adopted() int { return v.e.PoolAdopted() }

// TestPool_IdleInitKilled: the init of an idle pool container killed from
// outside; the next Start does not adopt the dead container but starts
// cold, the dead one is deleted (not left in runc's state), and the pool
// refills with a live one.
func TestPool_IdleInitKilled(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 1})
	waitPool(t, v, 1)
	v.e.pool.mu.Lock()
	dead := v.e.pool.idle[0]
	v.e.pool.mu.Unlock()
	if err := unix.PidfdSendSignal(dead.pidfd, unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	// A pidfd polls readable once its process has exited.
	fds := []unix.PollFd{{Fd: int32(dead.pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 60_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n != 1 {
			t.Fatalf("the killed init did not exit: %d %v", n, err)
		}
		break
	}
	if err := v.startAny(t, "att_k", executor.Spec{}); err != nil {
		t.Fatalf("start after the pool's init was killed: %v", err)
	}
	if got := v.sh(t, "att_k", "echo ok; cat /proc/1/cmdline"); got != "ok\n"+executor.InitPath+"\x00" {
		t.Fatalf("container: %q", got)
	}
	if v.adopted() != 0 {
		t.Fatal("the dead pool container was adopted")
	}
	waitPool(t, v, 1)
	v.e.pool.mu.Lock()
	live := v.e.pool.idle[0]
	v.e.pool.mu.Unlock()
	if live.id == dead.id {
		t.Fatal("the dead container is still idle")
	}
	if _, err := os.Stat(v.e.bundle(dead.id)); err == nil {
		t.Fatal("the dead container's bundle is left")
	}
}

// TestPool_ConcurrentStartsTakeDistinctContainers: more concurrent Starts
// than idle containers; each gets a container of its own (a distinct
// runc id, its own root, its own processes), adopted or cold, and stopping
// them while the pool refills leaves nothing.
func TestPool_ConcurrentStartsTakeDistinctContainers(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 2})
	waitPool(t, v, 2)
	const n = 4
	roots := make([]string, n)
	for i := range roots {
		roots[i] = filepath.Join(v.dir, "root"+strconv.Itoa(i))
		if err := runctest.Busybox(roots[i]); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(roots[i], "me"), []byte(strconv.Itoa(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = v.startAny(t, "att_c"+strconv.Itoa(i), executor.Spec{Rootfs: roots[i]})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
	}
	if a := v.adopted(); a < 1 || a > 2 {
		t.Fatalf("%d of %d starts adopted with 2 idle", a, n)
	}
	seen := map[string]bool{}
	for i := range n {
		id := "att_c" + strconv.Itoa(i)
		rid := v.e.runcID(id)
		if seen[rid] {
			t.Fatalf("two attempts share runc container %s", rid)
		}
		seen[rid] = true
		if got := v.sh(t, id, "cat /me"); got != strconv.Itoa(i) {
			t.Fatalf("container %d sees %q", i, got)
		}
		if ps := v.containerPids(t, id); len(ps) != 1 {
			t.Fatalf("container %d holds processes %v, want only its init", i, ps)
		}
	}
	// Stopped at once, while the pool is refilling: cleanups, then
	// checkClean after the pool closes.
}

// TestPool_AdoptionFailingMidwayStartsCold: an adoption that fails after
// the attempt's root was attached in the pool container's namespace (a
// mount nested in another whose source lacks its mountpoint) discards
// the pool container, removes what it made in the rootfs, and the Start
// goes on cold; the pool refills and nothing is left.
func TestPool_AdoptionFailingMidwayStartsCold(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 1})
	waitPool(t, v, 1)
	a, b := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(b, "f"), []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := v.startAny(t, "att_m", executor.Spec{Mounts: []executor.Mount{
		{Source: a, Destination: "/a"}, {Source: b, Destination: "/a/b"},
	}})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if got := v.sh(t, "att_m", "cat /a/b/f"); got != "b\n" {
		t.Fatalf("nested mount: %q", got)
	}
	if v.adopted() != 0 {
		t.Fatal("the nested mount was adopted; the test wants an adoption that fails after the root's switch began")
	}
	waitPool(t, v, 1)
	if err := v.e.Stop(v.ctx, "att_m"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(v.rootfs, "a")); err == nil {
		t.Fatal("the mountpoint /a is left in the rootfs")
	}
}

// TestPool_RestartWithPoolOffReapsIdle: a daemon that crashed with idle
// pool containers, restarted with the pool off (esfd --runc-pool 0 calls
// SetPoolSize(0)): the leftovers are stopped, not left running outside
// the quota for the new daemon's life.
func TestPool_RestartWithPoolOffReapsIdle(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 1})
	waitPool(t, v, 1)
	// The old executor "crashes": it forgets its idle container.
	v.e.pool.mu.Lock()
	old := v.e.pool.idle
	v.e.pool.idle, v.e.pool.closed = nil, true
	v.e.pool.mu.Unlock()
	for _, c := range old {
		unix.Close(c.pidfd)
	}
	e2, err := New(Options{StateDir: v.e.opts.StateDir, Init: initPath, Namespace: v.e.opts.Namespace})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e2.ClosePool(v.ctx); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	e2.SetPoolSize(0)
	v2 := &env{t: t, e: e2, ctx: v.ctx}
	deadline := time.Now().Add(2 * time.Minute)
	for runcPoolContainers(t, v2) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a restarted executor with its pool off leaves %d pool containers running", runcPoolContainers(t, v2))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPool_ColdStartEvictsAnIdleContainer: the pool fills exactly the room
// the quota gives it (SetPoolLimit 2, as esfd --max-attempts 2 with no live
// attempt). A Start no idle container can serve (CapAdd) starts cold, and
// evicts an idle container before it does: when it returns, idle and live
// containers together are still 2, not 3 until the quota's next word.
func TestPool_ColdStartEvictsAnIdleContainer(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 2})
	v.e.SetPoolLimit(2)
	waitPool(t, v, 2)
	if err := v.startAny(t, "att_cold", executor.Spec{CapAdd: []string{"CAP_MKNOD"}}); err != nil {
		t.Fatal(err)
	}
	if v.adopted() != 0 {
		t.Fatal("a spec with CapAdd was adopted")
	}
	if n, idle := runcPoolContainers(t, v), v.e.PoolIdle(); n != 1 || idle != 1 {
		t.Fatalf("after a cold start beside a full pool: %d pool containers in runc, %d idle; want 1 (live + idle within the limit of 2)", n, idle)
	}
}

// TestPool_ShutdownDuringRefill: an adopted container stopped (which lets
// the held-back refill start) and the pool closed while that refill runs:
// ClosePool returns only when the refill's container is stopped too, and
// a pool closed stays closed.
func TestPool_ShutdownDuringRefill(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 2})
	waitPool(t, v, 2)
	v.start("att_r", executor.Spec{})
	if err := v.e.Stop(v.ctx, "att_r"); err != nil {
		t.Fatal(err)
	}
	v.e.pool.mu.Lock()
	refilling := v.e.pool.starting
	v.e.pool.mu.Unlock()
	if err := v.e.ClosePool(v.ctx); err != nil {
		t.Fatal(err)
	}
	if n, idle := runcPoolContainers(t, v), v.e.PoolIdle(); n != 0 || idle != 0 {
		t.Fatalf("after ClosePool (%d refills were under way): %d pool containers in runc, %d idle", refilling, n, idle)
	}
	v.e.SetPoolSize(2)
	v.e.pool.mu.Lock()
	starting := v.e.pool.starting
	v.e.pool.mu.Unlock()
	if starting != 0 {
		t.Fatalf("a closed pool starts %d containers", starting)
	}
}

// TestPool_AttemptsNeverShareAContainer: one attempt after another on a
// pool of 1: the second gets another container (another runc id), and
// sees nothing of the first's files or processes, although the first left
// a process running in the background.
func TestPool_AttemptsNeverShareAContainer(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 1})
	v.start("att_1", executor.Spec{})
	first := v.e.runcID("att_1")
	v.sh(t, "att_1", "echo secret > /tmp/secret; setsid sleep 600 > /dev/null 2>&1 < /dev/null &")
	if err := v.e.Stop(v.ctx, "att_1"); err != nil {
		t.Fatal(err)
	}
	if pids := processesIn([]string{v.rootfs}); len(pids) != 0 {
		t.Fatalf("the first attempt's processes outlived its Stop: %v", pids)
	}
	root2 := filepath.Join(v.dir, "rootfs2")
	if err := runctest.Busybox(root2); err != nil {
		t.Fatal(err)
	}
	v.start("att_2", executor.Spec{Rootfs: root2})
	if second := v.e.runcID("att_2"); second == first {
		t.Fatalf("the second attempt got the first's container %s", first)
	}
	if got := v.sh(t, "att_2", "cat /tmp/secret 2>&1; ps -o args | grep -c '[s]leep 600' || true"); !strings.Contains(got, "No such file") || !strings.HasSuffix(got, "0\n") {
		t.Fatalf("the second attempt sees %q", got)
	}
}
