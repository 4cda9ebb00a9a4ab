package runc

import (
	"bufio"
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/internal/testenv"
)

// TestIsolation: the sandbox sees its own network with only a loopback
// that is up, none of the host's files (a daemon socket included), runs
// with no-new-privileges, seccomp and without CAP_SYS_ADMIN, under masked
// and read-only kernel paths, on exactly the given rootfs, and an extra
// read-only mount cannot be written.
func TestIsolation(t *testing.T) { coldAndPooled(t, testIsolation) }

func testIsolation(t *testing.T, opts Options) {
	v := newEnvWith(t, opts)
	// The daemon's socket, on the host, listening.
	sockDir := t.TempDir()
	sock := filepath.Join(sockDir, "esfd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	lower := t.TempDir()
	if err := os.WriteFile(filepath.Join(lower, "file"), []byte("lower\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	shared := t.TempDir()
	v.start("iso", executor.Spec{Mounts: []executor.Mount{
		{Source: lower, Destination: "/.esf/lower", ReadOnly: true},
		{Source: shared, Destination: "/.esf/shared"},
	}})

	t.Run("only loopback, up", func(t *testing.T) {
		devs := v.sh(t, "iso", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
		if devs != "lo\n" {
			t.Fatalf("interfaces %q, want only lo", devs)
		}
		link := v.sh(t, "iso", "ip -o link")
		if strings.Count(link, "\n") != 1 || !strings.Contains(link, "lo: <LOOPBACK,UP,LOWER_UP>") {
			t.Fatalf("ip link: %q", link)
		}
		// Loopback works: a listener inside is reachable inside. The
		// listener's stdin must not end: busybox nc may quit at its EOF
		// before it read the connection (1 run in 10 with /dev/null).
		script := "(sleep 5 | nc -l -p 7777 > /tmp/nc.out) > /dev/null 2>&1 & " +
			"for i in $(seq 100); do echo ping | nc 127.0.0.1 7777 2>/dev/null && break; sleep 0.1; done; " +
			"for i in $(seq 100); do [ -s /tmp/nc.out ] && break; sleep 0.05; done; cat /tmp/nc.out"
		if got := v.sh(t, "iso", script); got != "ping\n" {
			t.Fatalf("loopback round trip: %q", got)
		}
	})

	t.Run("daemon socket unreachable", func(t *testing.T) {
		r := v.run(v.ctx, "iso", executor.ExecSpec{}, "sh", "-c", "test -e "+sock+" || test -e "+sockDir)
		if r.err != nil || r.code != 1 {
			t.Fatalf("host path visible inside: code %d err %v", r.code, r.err)
		}
		if got := v.sh(t, "iso", "grep -c esfd.sock /proc/net/unix || true"); got != "0\n" {
			t.Fatalf("the host's socket shows in the container's /proc/net/unix: %q", got)
		}
		r = v.run(v.ctx, "iso", executor.ExecSpec{}, "sh", "-c", "echo hi | nc local:"+sock)
		if r.code == 0 {
			t.Fatal("connected to the host's daemon socket")
		}
	})

	t.Run("privileges", func(t *testing.T) {
		status := v.sh(t, "iso", "cat /proc/self/status")
		fields := map[string]string{}
		sc := bufio.NewScanner(strings.NewReader(status))
		for sc.Scan() {
			k, val, _ := strings.Cut(sc.Text(), ":")
			fields[k] = strings.TrimSpace(val)
		}
		if fields["NoNewPrivs"] != "1" || fields["Seccomp"] != "2" {
			t.Fatalf("NoNewPrivs %q Seccomp %q", fields["NoNewPrivs"], fields["Seccomp"])
		}
		capEff, err := strconv.ParseUint(fields["CapEff"], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if capEff&(1<<unix.CAP_SYS_ADMIN) != 0 || capEff&(1<<unix.CAP_NET_ADMIN) != 0 || capEff&(1<<unix.CAP_SYS_PTRACE) != 0 {
			t.Fatalf("CapEff %x holds admin capabilities", capEff)
		}
		if capEff&(1<<unix.CAP_CHOWN) == 0 {
			t.Fatalf("CapEff %x lacks the default CAP_CHOWN", capEff)
		}
		// Seccomp refuses what the default profile refuses (unshare
		// needs CAP_SYS_ADMIN, which the profile also gates).
		if r := v.run(v.ctx, "iso", executor.ExecSpec{}, "unshare", "-n", "true"); r.code == 0 {
			t.Fatal("unshare of a network namespace succeeded")
		}
		if r := v.run(v.ctx, "iso", executor.ExecSpec{}, "mount", "-t", "tmpfs", "x", "/tmp"); r.code == 0 {
			t.Fatal("mount succeeded")
		}
	})

	t.Run("masked and read-only kernel paths", func(t *testing.T) {
		// containerd masks these with /dev/null; check those this kernel
		// has and that are not empty on the host.
		masked := 0
		for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats"} {
			if b, err := os.ReadFile(p); err != nil || len(b) == 0 {
				continue
			}
			masked++
			if got := v.sh(t, "iso", "wc -c < "+p); strings.TrimSpace(got) != "0" {
				t.Errorf("%s not masked: %q bytes", p, got)
			}
		}
		if masked == 0 {
			t.Error("no maskable /proc file on this kernel to check")
		}
		r := v.run(v.ctx, "iso", executor.ExecSpec{}, "sh", "-c", "echo 1 > /proc/sys/kernel/ns_last_pid")
		if r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
			t.Fatalf("/proc/sys writable: %d %q", r.code, r.stderr)
		}
		if r := v.run(v.ctx, "iso", executor.ExecSpec{}, "sh", "-c", "echo x > /sys/kernel/x"); r.code == 0 {
			t.Fatal("/sys writable")
		}
		if got := v.sh(t, "iso", "hostname"); got != "esf\n" {
			t.Fatalf("hostname %q", got)
		}
	})

	t.Run("rootfs is the given directory", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(v.rootfs, "tmp", "from-host"), []byte("host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := v.sh(t, "iso", "cat /tmp/from-host; echo inside > /tmp/from-inside; ls /"); !strings.HasPrefix(got, "host\n") {
			t.Fatalf("inside sees %q", got)
		}
		b, err := os.ReadFile(filepath.Join(v.rootfs, "tmp", "from-inside"))
		if err != nil || string(b) != "inside\n" {
			t.Fatalf("host sees %q %v", b, err)
		}
		// The root is writable: a new top-level directory appears on the host.
		v.sh(t, "iso", "mkdir /newdir")
		if fi, err := os.Stat(filepath.Join(v.rootfs, "newdir")); err != nil || !fi.IsDir() {
			t.Fatalf("mkdir /newdir: %v", err)
		}
		// Nothing of the host beyond it: the init binary is the only
		// executor file, and it is read-only.
		r := v.run(v.ctx, "iso", executor.ExecSpec{}, "sh", "-c", "echo x > /.esf/init")
		if r.code == 0 {
			t.Fatal("init writable")
		}
	})

	t.Run("read-only mount", func(t *testing.T) {
		if got := v.sh(t, "iso", "cat /.esf/lower/file"); got != "lower\n" {
			t.Fatalf("read-only mount reads %q", got)
		}
		r := v.run(v.ctx, "iso", executor.ExecSpec{}, "sh", "-c", "echo x > /.esf/lower/new")
		if r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
			t.Fatalf("write to the read-only mount: %d %q", r.code, r.stderr)
		}
		if _, err := os.Stat(filepath.Join(lower, "new")); err == nil {
			t.Fatal("the write reached the host")
		}
		v.sh(t, "iso", "echo rw > /.esf/shared/f")
		if b, err := os.ReadFile(filepath.Join(shared, "f")); err != nil || string(b) != "rw\n" {
			t.Fatalf("read-write mount: %q %v", b, err)
		}
	})
}

// TestLimits: memory, pids and CPU limits are enforced by the kernel.
func TestLimits(t *testing.T) { coldAndPooled(t, testLimits) }

func testLimits(t *testing.T, opts Options) {
	v := newEnvWith(t, opts)
	v.start("lim", executor.Spec{Limits: executor.Limits{MemoryBytes: 32 << 20, Pids: 16, CPUs: 0.5}})

	t.Run("memory", func(t *testing.T) {
		// The init is exempt from the OOM killer (where the daemon may
		// lower scores), the sandbox is not.
		want := "0\n0\n"
		if canLowerOOMScore() {
			want = "-1000\n0\n"
		}
		if got := v.sh(t, "lim", "cat /proc/1/oom_score_adj /proc/self/oom_score_adj"); got != want {
			t.Fatalf("oom_score_adj of init and exec: %q, want %q", got, want)
		}
		// A 64 MiB buffer does not fit in 32 MiB: the OOM killer ends dd.
		// (One allocating process only: a pipeline's writer would invoke
		// the killer again while its victim's memory is being freed, and
		// a score-0 init could then be chosen.)
		r := v.run(v.ctx, "lim", executor.ExecSpec{}, "sh", "-c", `dd if=/dev/zero of=/dev/null bs=64M count=1 2>/dev/null; echo dd=$?`)
		if r.err != nil || r.code != 0 || r.stdout != "dd=137\n" {
			t.Fatalf("code %d err %v stdout %q stderr %q", r.code, r.err, r.stdout, r.stderr)
		}
		// The container survived its OOM, and what fits still runs.
		if got := v.sh(t, "lim", `dd if=/dev/zero of=/dev/null bs=1M count=1 2>/dev/null; echo dd=$?`); got != "dd=0\n" {
			t.Fatalf("1 MiB: %q", got)
		}
	})

	t.Run("pids", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(v.ctx, 20*time.Second)
		defer cancel()
		r := v.run(ctx, "lim", executor.ExecSpec{}, "sh", "-c", `i=0; while [ $i -lt 40 ]; do sleep 30 >/dev/null 2>&1 & i=$((i+1)); done; echo spawned`)
		if !strings.Contains(r.stdout+r.stderr, "fork") {
			t.Fatalf("40 processes under a limit of 16: code %d err %v stdout %q stderr %q", r.code, r.err, r.stdout, r.stderr)
		}
		v.killAllBut(t, "lim")
	})

	t.Run("cpu", func(t *testing.T) {
		// The quota is in the container's cgroup, v1 or v2.
		cg := v.sh(t, "lim", "cat /proc/self/cgroup")
		var path string
		for _, l := range strings.Split(strings.TrimSpace(cg), "\n") {
			parts := strings.SplitN(l, ":", 3)
			if len(parts) != 3 {
				continue
			}
			for _, c := range strings.Split(parts[1], ",") {
				if c == "cpu" {
					path = filepath.Join("/sys/fs/cgroup/cpu", parts[2], "cpu.cfs_quota_us")
				}
			}
			if parts[0] == "0" && path == "" {
				path = filepath.Join("/sys/fs/cgroup", parts[2], "cpu.max")
			}
		}
		// Inside, /proc/self/cgroup is relative to the cgroup namespace
		// root when there is one; find the host path from the init then.
		if _, err := os.Stat(path); err != nil {
			info, _ := v.e.State(v.ctx, "lim")
			b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(info.Pid), "cgroup"))
			t.Fatalf("no cpu cgroup file %s (host view %q)", path, b)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.TrimSpace(string(b))
		if got != "50000" && got != "50000 100000" {
			t.Fatalf("%s = %q, want a quota of 50000 per 100000", path, got)
		}
	})
}

// killAllBut kills every process of the container but its init.
func (v *env) killAllBut(t *testing.T, id string) {
	t.Helper()
	info, err := v.e.State(v.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range v.containerPids(t, id) {
		if st.pid != info.Pid {
			unix.Kill(st.pid, unix.SIGKILL)
		}
	}
}

// TestFootprintOverlay runs a container on a real overlay (the attempt's
// root in production) and checks the footprint contract fabric relies on:
// while it runs, every entry of the upper dir the sandbox did not write
// lies under Spec.Footprint(); after Stop only the sandbox's writes remain
// in the upper dir, and the lower is untouched.
func TestFootprintOverlay(t *testing.T) { coldAndPooled(t, testFootprintOverlay) }

func testFootprintOverlay(t *testing.T, opts Options) {
	v := newEnvWith(t, opts)
	dir := t.TempDir()
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ovl := "lowerdir=" + v.rootfs + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", 0, ovl); err != nil {
		testenv.Require(t, "overlay") // skips, or fails in CI
		t.Fatalf("overlay mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, 0); err != nil {
			t.Errorf("unmount overlay: %v", err)
		}
	})
	data := t.TempDir()
	spec := executor.Spec{Rootfs: merged, Mounts: []executor.Mount{
		{Source: v.rootfs, Destination: "/.esf/lower", ReadOnly: true},
		{Source: data, Destination: "/mnt/data"},
	}}
	v.mu.Lock()
	v.roots = append(v.roots, merged)
	v.mu.Unlock()
	if v.pooled {
		v.waitIdle()
	}
	if err := v.e.Start(v.ctx, "fp", spec); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			v.e.Stop(context.Background(), "fp")
		}
	}()
	v.sh(t, "fp", "echo w > /tmp/written; mkdir -p /work/a; echo x > /work/a/b")

	footprint := spec.Footprint()
	sandbox := []string{"/tmp", "/work"}
	under := func(p string, roots []string) bool {
		for _, r := range roots {
			if p == r || strings.HasPrefix(p, r+"/") {
				return true
			}
		}
		return false
	}
	var stray []string
	filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		rel := strings.TrimPrefix(p, upper)
		if err != nil || rel == "" {
			return err
		}
		// /mnt is the parent runc made for /mnt/data: a caller's extra
		// mount outside /.esf adds its missing parents too.
		if !under(rel, footprint) && !under(rel, sandbox) && rel != "/mnt" {
			stray = append(stray, rel)
		}
		return nil
	})
	if len(stray) != 0 {
		t.Fatalf("upper dir entries outside the footprint while running: %v (footprint %v)", stray, footprint)
	}
	for _, want := range []string{"/.esf", "/proc", "/dev", "/sys", "/run"} {
		if _, err := os.Lstat(filepath.Join(upper, want)); err != nil {
			t.Errorf("%s is not in the upper dir while running (the fixture has none): %v", want, err)
		}
	}

	stopped = true
	if err := v.e.Stop(v.ctx, "fp"); err != nil {
		t.Fatal(err)
	}
	if v.pooled {
		// The refill the first exec let go is a runc run, whose new mount
		// namespace holds a copy of every host mount (this overlay too)
		// until it pivots: done before the cleanup unmounts the overlay,
		// as fabric's release retries a busy root.
		v.waitIdle()
	}
	var left []string
	filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if rel := strings.TrimPrefix(p, upper); rel != "" {
			left = append(left, rel)
		}
		return err
	})
	want := []string{"/tmp", "/tmp/written", "/work", "/work/a", "/work/a/b"}
	if strings.Join(left, " ") != strings.Join(want, " ") {
		t.Fatalf("upper dir after stop: %v, want %v", left, want)
	}
	if _, err := os.Stat(filepath.Join(v.rootfs, "tmp", "written")); err == nil {
		t.Fatal("the write reached the lower dir")
	}
}
