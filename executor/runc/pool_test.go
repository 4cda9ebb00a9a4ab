package runc

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/esf-dev/esf/executor"
)

// mountTable is a container's mount table as its sandbox sees it, without
// what differs between two containers (ids, device numbers, sources):
// mountpoint, options, type, super options; sorted.
func mountTable(t *testing.T, v *env, id string) []string {
	t.Helper()
	var out []string
	for l := range strings.SplitSeq(strings.TrimSpace(v.sh(t, id, "cat /proc/self/mountinfo")), "\n") {
		f := strings.Fields(l)
		sep := slices.Index(f, "-")
		if len(f) < 6 || sep < 0 || sep+3 >= len(f) {
			t.Fatalf("mountinfo line %q", l)
		}
		// Super options of a tmpfs carry its size and inode count,
		// which depend on the host, not the container.
		out = append(out, strings.Join([]string{f[4], f[5], f[sep+1], f[sep+3]}, " "))
	}
	// Sorted: the order is the mounts' ids, which adoption changes (the
	// root is mounted after the rest).
	slices.Sort(out)
	return out
}

// cgroupLimits reads the limits runc would have set from the cgroup of
// container id, v1 or v2.
func cgroupLimits(t *testing.T, v *env, id string) map[string]string {
	t.Helper()
	var cs specs.Spec
	if err := readJSON(filepath.Join(v.e.bundle(id), "config.json"), &cs); err != nil {
		t.Fatal(err)
	}
	cg := cs.Linux.CgroupsPath
	out := map[string]string{}
	for _, f := range []string{
		"memory/memory.limit_in_bytes", "memory/memory.memsw.limit_in_bytes", "pids/pids.max",
		"cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us",
		"memory.max", "memory.swap.max", "pids.max", "cpu.max",
	} {
		ctl, file := filepath.Split(f)
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctl, cg, file))
		if err == nil {
			out[f] = strings.TrimSpace(string(b))
		}
	}
	if len(out) == 0 {
		t.Fatalf("no cgroup limit files for %s at %s", id, cg)
	}
	return out
}

// TestPool_AdoptedContainerIsItsSpecs: a container adopted from the pool
// is the one a cold start makes of the same spec, seen from inside (its
// root's files, mount table, hostname, environment, workdir, extra
// mounts) and from the host (cgroup limits, the init's root, State, List,
// a restarted executor); its Stop leaves nothing, the pool's stub neither.
func TestPool_AdoptedContainerIsItsSpecs(t *testing.T) {
	cold := newEnv(t)
	pooled := newEnvWith(t, Options{PoolSize: 1})
	lower := t.TempDir()
	if err := os.WriteFile(filepath.Join(lower, "file"), []byte("lower\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := func(v *env) executor.Spec {
		return executor.Spec{
			Env: []string{"WHO=attempt"}, Workdir: "/tmp", Hostname: "h1",
			Limits: executor.Limits{MemoryBytes: 48 << 20, Pids: 20, CPUs: 0.25},
			Mounts: []executor.Mount{{Source: lower, Destination: "/.esf/lower", ReadOnly: true}},
		}
	}
	for _, v := range []*env{cold, pooled} {
		if err := os.WriteFile(filepath.Join(v.rootfs, "marker"), []byte(v.rootfs+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		v.start("att_x", spec(v))
	}

	script := `cat /marker; hostname; pwd; echo $WHO; cat /.esf/lower/file; ls -a / | tr '\n' ' '; echo; ` +
		`touch /.esf/lower/w 2>/dev/null && echo writable || echo read-only; echo new > /tmp/made`
	want := cold.sh(t, "att_x", script)
	got := pooled.sh(t, "att_x", script)
	if strings.Replace(got, pooled.rootfs, "ROOT", 1) != strings.Replace(want, cold.rootfs, "ROOT", 1) {
		t.Fatalf("pooled container sees\n%s\ncold one\n%s", got, want)
	}
	if strings.Contains(got, adoptDir) || !strings.Contains(got, "read-only") {
		t.Fatalf("pooled container sees %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(pooled.rootfs, "tmp", "made")); err != nil || string(b) != "new\n" {
		t.Fatalf("the container's write in its root: %q %v", b, err)
	}
	if w, g := mountTable(t, cold, "att_x"), mountTable(t, pooled, "att_x"); !slices.Equal(w, g) {
		t.Fatalf("mount tables differ:\npooled %q\ncold   %q", g, w)
	}
	if w, g := cgroupLimits(t, cold, "att_x"), cgroupLimits(t, pooled, "att_x"); !mapsEqual(w, g) {
		t.Fatalf("cgroup limits differ:\npooled %v\ncold   %v", g, w)
	}

	info, err := pooled.e.State(pooled.ctx, "att_x")
	if err != nil || info.ID != "att_x" || info.Status != executor.StatusRunning || info.Rootfs != pooled.rootfs {
		t.Fatalf("state: %+v %v", info, err)
	}
	if pids := processesIn([]string{pooled.rootfs}); !slices.Contains(pids, info.Pid) {
		t.Fatalf("the init (%d) is not rooted in the attempt's root (%v)", info.Pid, pids)
	}
	// The pool's next container is not listed; a restarted executor
	// finds the adopted one by its id.
	pooled.waitIdle()
	e2, err := New(Options{StateDir: pooled.e.opts.StateDir, Init: initPath, Namespace: pooled.e.opts.Namespace})
	if err != nil {
		t.Fatal(err)
	}
	list, err := e2.List(pooled.ctx, "")
	if err != nil || len(list) != 1 || list[0].ID != "att_x" || list[0].Rootfs != pooled.rootfs || list[0].Pid != info.Pid {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := e2.Freeze(pooled.ctx, "att_x"); err != nil {
		t.Fatal(err)
	}
	if i, err := e2.State(pooled.ctx, "att_x"); err != nil || i.Status != executor.StatusPaused {
		t.Fatalf("after freeze: %+v %v", i, err)
	}
	if err := e2.Thaw(pooled.ctx, "att_x"); err != nil {
		t.Fatal(err)
	}
	v2 := &env{t: t, e: e2, ctx: pooled.ctx}
	if got := v2.sh(t, "att_x", "cat /tmp/made"); got != "new\n" {
		t.Fatalf("exec through a restarted executor: %q", got)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// runcPoolContainers counts the pool's containers runc knows; -1 when
// runc list failed (it does when a container it lists is being deleted).
func runcPoolContainers(t *testing.T, v *env) int {
	t.Helper()
	cs, err := v.e.rc.List(v.ctx)
	if err != nil {
		return -1
	}
	n := 0
	for _, c := range cs {
		if strings.HasPrefix(c.ID, poolPrefix) {
			n++
		}
	}
	return n
}

func waitPool(t *testing.T, v *env, idle int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for v.e.PoolIdle() != idle || runcPoolContainers(t, v) != idle {
		if time.Now().After(deadline) {
			t.Fatalf("pool: %d idle, %d in runc, want %d", v.e.PoolIdle(), runcPoolContainers(t, v), idle)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPool_ResizeLimitAndSweep: the pool follows its size and its limit
// (the quota's room) both ways, leaves no container behind when it
// shrinks or closes, and a new executor on the same state dir (a daemon
// after a crash) removes the pool containers the old one left.
func TestPool_ResizeLimitAndSweep(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 2})
	waitPool(t, v, 2)
	v.e.SetPoolLimit(1)
	waitPool(t, v, 1)
	v.e.SetPoolLimit(0)
	waitPool(t, v, 0)
	v.e.SetPoolLimit(-1)
	waitPool(t, v, 2)
	v.e.SetPoolSize(1)
	waitPool(t, v, 1)

	// The old executor "crashed": its idle container is a leftover.
	old := v.e.PoolIdle()
	e2, err := New(Options{StateDir: v.e.opts.StateDir, Init: initPath, Namespace: v.e.opts.Namespace, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e2.ClosePool(v.ctx); err != nil {
			t.Errorf("close pool: %v", err)
		}
	})
	v2 := &env{t: t, e: e2, ctx: v.ctx}
	deadline := time.Now().Add(2 * time.Minute)
	for e2.PoolIdle() != 1 || runcPoolContainers(t, v2) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("after a restart: %d idle, %d in runc, want 1 (old executor had %d)", e2.PoolIdle(), runcPoolContainers(t, v2), old)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ents, err := os.ReadDir(filepath.Join(v.e.opts.StateDir, stubsDir)); err != nil || len(ents) != 1 {
		t.Fatalf("stubs after the sweep: %v %v", ents, err)
	}
}

// TestPool_RefillWaitsForFirstExec: while another container is idle, the
// replacement of an adopted one (a runc run, CPU-heavy) starts only once
// the adopted container's first exec has ended, not beside the adoption
// and the command an activation waits for.
func TestPool_RefillWaitsForFirstExec(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 2})
	waitPool(t, v, 2)
	v.start("first", executor.Spec{})
	v.e.pool.mu.Lock()
	idle, starting := len(v.e.pool.idle), v.e.pool.starting
	v.e.pool.mu.Unlock()
	if idle != 1 || starting != 0 {
		t.Fatalf("after the adoption: %d idle, %d starting; want 1 idle and no refill before the first exec", idle, starting)
	}
	v.sh(t, "first", "true")
	waitIdle(t, v, 2)

	// A Stop before any exec gives the hold back too.
	if err := v.e.Start(v.ctx, "second", executor.Spec{Rootfs: v.rootfs}); err != nil {
		t.Fatal(err)
	}
	if err := v.e.Stop(v.ctx, "second"); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, v, 2)
}

// waitIdle waits until the pool has n idle containers (adopted ones keep
// their pool runc id, so runc's list is no measure here).
func waitIdle(t *testing.T, v *env, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for v.e.PoolIdle() != n {
		if time.Now().After(deadline) {
			t.Fatalf("pool: %d idle, want %d", v.e.PoolIdle(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
