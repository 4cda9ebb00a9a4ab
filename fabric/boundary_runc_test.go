package fabric

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/journal"
)

// TestBoundary_SealKeepsSandboxOwnership: a runc attempt's root is an
// unprivileged host user, yet the sealed tree records ownership as the
// sandbox saw it: root's files as uid 0, its user's as theirs. On the host,
// the live root shows the container's files as owned by the range, so a
// setuid file the sandbox makes is not setuid root there.
func TestBoundary_SealKeepsSandboxOwnership(t *testing.T) {
	runcColdAndPooled(t, testBoundarySealKeepsSandboxOwnership)
}

func testBoundarySealKeepsSandboxOwnership(t *testing.T, pool int) {
	f, g := openRuncWith(t, withRuncPool(t, pool))
	ctx := context.Background()
	a, err := activateRunc(t, f, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if out, errs, code := run(t, f, a.AttemptID, "sh", "-ec",
		"id -u; echo r > /rootfile; mkdir /home; echo u > /home/userfile; chown -R 1000:1000 /home; "+
			"cp /bin/busybox /suid; chmod 4755 /suid; chmod 1777 /tmp; touch /tmp/t"); out != "0\n" || code != 0 {
		t.Fatalf("as the sandbox's root: %q, exit %d: %s", out, code, errs)
	}
	owner := func(p string) (uint32, uint32) {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid, st.Gid
	}
	live, err := f.attemptView(ctx, a.AttemptID)
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := owner(filepath.Join(live.Root, "suid")); u != testUserNS.Start {
		t.Fatalf("on the host, the sandbox's setuid file is owned by %d, want %d (not root)", u, testUserNS.Start)
	}
	sealed, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	exp := filepath.Join(t.TempDir(), "exp")
	if _, _, err := f.ExportDir(ctx, sealed.Node.NodeID, exp); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]uint32{"rootfile": 0, "suid": 0, "tmp": 0, "tmp/t": 0, "home": 1000, "home/userfile": 1000} {
		if u, g := owner(filepath.Join(exp, p)); u != want || g != want {
			t.Errorf("sealed %s is owned by %d:%d, want %d:%d as the sandbox saw it", p, u, g, want, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(exp, "rootfile")); err != nil || string(b) != "r\n" {
		t.Errorf("sealed rootfile = %q, %v", b, err)
	}
	// A new container on the child sees its files as its own again.
	b, err := activateRunc(t, f, ActivateRequest{NodeID: sealed.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, code := run(t, f, b.AttemptID, "sh", "-c", "stat -c '%u:%g' /rootfile /home/userfile && echo again >> /rootfile"); out != "0:0\n1000:1000\n" || code != 0 {
		t.Fatalf("owners inside the next container: %q, exit %d", out, code)
	}
}

// cgroupLimits reads a container's memory, pids and CPU limits from its
// cgroup (v1 or v2; runc's default namespace "esf"): -1 for unlimited.
func cgroupLimits(t *testing.T, id string) (mem, pids int64, cpus float64) {
	t.Helper()
	read := func(p string) (string, bool) {
		b, err := os.ReadFile(p)
		return strings.TrimSpace(string(b)), err == nil
	}
	num := func(s string) int64 {
		if s == "max" {
			return -1
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("cgroup value %q: %v", s, err)
		}
		return n
	}
	const ns = "esf"
	if v, ok := read(filepath.Join("/sys/fs/cgroup/memory", ns, id, "memory.limit_in_bytes")); ok {
		mem = num(v)
		if mem >= 1<<62 {
			mem = -1
		}
		v, _ = read(filepath.Join("/sys/fs/cgroup/pids", ns, id, "pids.max"))
		pids = num(v)
		q, _ := read(filepath.Join("/sys/fs/cgroup/cpu", ns, id, "cpu.cfs_quota_us"))
		p, _ := read(filepath.Join("/sys/fs/cgroup/cpu", ns, id, "cpu.cfs_period_us"))
		if num(q) < 0 {
			return mem, pids, -1
		}
		return mem, pids, float64(num(q)) / float64(num(p))
	}
	dir := filepath.Join("/sys/fs/cgroup", ns, id)
	v, ok := read(filepath.Join(dir, "memory.max"))
	if !ok {
		t.Fatalf("no cgroup of %s (v1 or v2)", id)
	}
	mem = num(v)
	v, _ = read(filepath.Join(dir, "pids.max"))
	pids = num(v)
	v, _ = read(filepath.Join(dir, "cpu.max"))
	q, p, _ := strings.Cut(v, " ")
	if q == "max" {
		return mem, pids, -1
	}
	return mem, pids, float64(num(q)) / float64(num(p))
}

// TestBoundary_DefaultLimitsInCgroup: a runc attempt that names no limits
// gets the daemon's defaults in its cgroup; one that names them gets its
// own, field by field.
func TestBoundary_DefaultLimitsInCgroup(t *testing.T) {
	runcColdAndPooled(t, testBoundaryDefaultLimitsInCgroup)
}

func testBoundaryDefaultLimitsInCgroup(t *testing.T, pool int) {
	def := executor.Limits{MemoryBytes: 1 << 30, Pids: 1024, CPUs: 1}
	f, g := openRuncWith(t, func(o *Options) { o.DefaultLimits = def; withRuncPool(t, pool)(o) })
	ctx := context.Background()
	a, err := activateRunc(t, f, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if mem, pids, cpus := cgroupLimits(t, runcID(f, a.AttemptID)); mem != def.MemoryBytes || pids != def.Pids || cpus != def.CPUs {
		t.Fatalf("a plain activation's cgroup: memory %d, pids %d, cpus %v; want the defaults %+v", mem, pids, cpus, def)
	}
	b, err := activateRunc(t, f, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc, MemoryBytes: 300 << 20, CPUs: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if mem, pids, cpus := cgroupLimits(t, runcID(f, b.AttemptID)); mem != 300<<20 || pids != def.Pids || cpus != 0.5 {
		t.Fatalf("with --memory 300M --cpus 0.5: memory %d, pids %d, cpus %v", mem, pids, cpus)
	}
	// A limit nothing can run under is the caller's mistake.
	for _, req := range []ActivateRequest{{MemoryBytes: 1 << 20}, {Pids: 3}, {CPUs: 0.001}, {Pids: -1}, {CapAdd: []string{"CAP_SYS_ADMIN"}}} {
		req.NodeID, req.Executor = g.Node.NodeID, ExecutorRunc
		if _, err := f.Activate(ctx, req); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("activate %+v: %v, want invalid_argument", req, err)
		}
	}
}

// TestBoundary_QuotaMemoryEqualsCgroup: what an attempt reserves against
// --max-memory is its cgroup's memory limit, with or without a default
// and with or without its own.
func TestBoundary_QuotaMemoryEqualsCgroup(t *testing.T) {
	for _, tc := range []struct {
		name       string
		def, own   int64
		wantMemory int64
	}{
		{"quota only", 0, 0, DefaultAttemptMemory},
		{"daemon default", 1 << 30, 0, 1 << 30},
		{"own limit", 1 << 30, 200 << 20, 200 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, g := openRuncWith(t, func(o *Options) {
				o.MaxMemoryBytes = 4 << 30
				o.DefaultLimits.MemoryBytes = tc.def
			})
			a, err := f.Activate(context.Background(), ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc, MemoryBytes: tc.own})
			if err != nil {
				t.Fatal(err)
			}
			reserved := f.quota.memOf(a.AttemptID)
			mem, _, _ := cgroupLimits(t, runcID(f, a.AttemptID))
			if reserved != tc.wantMemory || mem != tc.wantMemory {
				t.Fatalf("reserved %d, cgroup %d; want both %d", reserved, mem, tc.wantMemory)
			}
		})
	}
}

// TestBoundary_OOMKilledReported: a command the OOM killer ends at the
// attempt's memory limit says so in its result; a command that is sent
// SIGKILL otherwise does not.
func TestBoundary_OOMKilledReported(t *testing.T) {
	f, g := openRunc(t)
	ctx := context.Background()
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc, MemoryBytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.Exec(ctx, ExecRequest{AttemptID: a.AttemptID, Args: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"}}, ExecStreams{})
	if err != nil || res.ExitCode != 137 || !res.OOMKilled {
		t.Fatalf("256M in a 32M attempt: %+v, %v; want exit 137 and oom_killed", res, err)
	}
	res, err = f.Exec(ctx, ExecRequest{AttemptID: a.AttemptID, Args: []string{"sh", "-c", "kill -9 $$"}}, ExecStreams{})
	if err != nil || res.ExitCode != 137 || res.OOMKilled {
		t.Fatalf("kill -9 of itself: %+v, %v; want exit 137 without oom_killed", res, err)
	}
}
