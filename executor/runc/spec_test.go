package runc

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/internal/testenv"
)

// newSpecExecutor is an Executor for tests that build specs only: any
// executable stands in for the init. It needs runc in PATH (New checks).
func newSpecExecutor(t *testing.T) *Executor {
	t.Helper()
	dir := t.TempDir()
	init := filepath.Join(dir, "init")
	if err := os.WriteFile(init, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{StateDir: filepath.Join(dir, "state"), Init: init})
	if err != nil {
		testenv.Require(t, "runc") // skips, or fails in CI
		t.Fatalf("no runc executor: %v", err)
	}
	return e
}

// TestContainerSpec pins what every container gets: containerd's defaults
// (fresh network namespace, capabilities, masked and read-only paths), the
// init mounted read-only, no-new-privileges, seccomp, limits, the rootfs
// read-write.
func TestContainerSpec(t *testing.T) {
	e := newSpecExecutor(t)
	rootfs := t.TempDir()
	s, err := e.containerSpec(context.Background(), "att_x", executor.Spec{
		Rootfs:  rootfs,
		Env:     []string{"A=1"},
		Workdir: "/work",
		User:    executor.User{UID: 7, GID: 8},
		Limits:  executor.Limits{MemoryBytes: 512 << 20, Pids: 256, CPUs: 1.5},
		Mounts:  []executor.Mount{{Source: rootfs, Destination: "/.esf/lower", ReadOnly: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.Root.Path != rootfs || s.Root.Readonly {
		t.Errorf("root %+v", s.Root)
	}
	p := s.Process
	if !slices.Equal(p.Args, []string{executor.InitPath}) || p.Cwd != "/" || !p.NoNewPrivileges || p.Terminal {
		t.Errorf("process %+v", p)
	}
	if canLowerOOMScore() && (p.OOMScoreAdj == nil || *p.OOMScoreAdj != -1000) {
		t.Errorf("init oom_score_adj %v", p.OOMScoreAdj)
	}
	if p.User.UID != 7 || p.User.GID != 8 {
		t.Errorf("user %+v", p.User)
	}
	if !slices.Contains(p.Env, "A=1") || !slices.ContainsFunc(p.Env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }) {
		t.Errorf("env %v", p.Env)
	}
	if slices.Contains(p.Capabilities.Bounding, "CAP_SYS_ADMIN") || !slices.Contains(p.Capabilities.Bounding, "CAP_CHOWN") {
		t.Errorf("capabilities %v", p.Capabilities.Bounding)
	}
	var netns bool
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace && ns.Path == "" {
			netns = true
		}
	}
	if !netns {
		t.Errorf("no fresh network namespace in %+v", s.Linux.Namespaces)
	}
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != specs.ActErrno || len(s.Linux.Seccomp.Syscalls) == 0 {
		t.Errorf("seccomp %+v", s.Linux.Seccomp)
	}
	if !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Errorf("masked %v read-only %v", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	if s.Linux.CgroupsPath != "/esf/att_x" {
		t.Errorf("cgroups path %q", s.Linux.CgroupsPath)
	}
	r := s.Linux.Resources
	if *r.Memory.Limit != 512<<20 || *r.Pids.Limit != 256 || *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 {
		t.Errorf("resources memory %d pids %d cpu %d/%d", *r.Memory.Limit, *r.Pids.Limit, *r.CPU.Quota, *r.CPU.Period)
	}
	if s.Annotations[annotationWorkdir] != "/work" || s.Hostname != defaultHostname {
		t.Errorf("annotations %v hostname %q", s.Annotations, s.Hostname)
	}
	found := map[string][]string{}
	for _, m := range s.Mounts {
		found[m.Destination] = m.Options
	}
	if o := found[executor.InitPath]; !slices.Contains(o, "ro") || !slices.Contains(o, "rbind") {
		t.Errorf("init mount options %v", o)
	}
	if o := found["/.esf/lower"]; !slices.Contains(o, "ro") {
		t.Errorf("read-only mount options %v", o)
	}

	// Footprint() must cover every mountpoint runc may create in the
	// rootfs: the top component of each leaf of the default spec.
	for _, leaf := range mountLeaves(s.Mounts) {
		top := "/" + components(leaf)[0]
		if !slices.Contains(executor.Footprint(), top) {
			t.Errorf("mountpoint %s lies outside Footprint() %v", leaf, executor.Footprint())
		}
	}

	// No limits: no resources beyond the defaults.
	s, err = e.containerSpec(context.Background(), "att_y", executor.Spec{Rootfs: rootfs})
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Linux.Resources; r.Memory != nil || r.Pids != nil || (r.CPU != nil && r.CPU.Quota != nil) {
		t.Errorf("unlimited spec has limits %+v", r)
	}
}

// TestProcessSpec: an exec inherits the container's process and overrides
// what it names.
func TestProcessSpec(t *testing.T) {
	e := newSpecExecutor(t)
	ctx := context.Background()
	cs, err := e.containerSpec(ctx, "c", executor.Spec{Rootfs: t.TempDir(), Env: []string{"A=1", "B=2"}, Workdir: "/w", User: executor.User{UID: 5, GID: 5}})
	if err != nil {
		t.Fatal(err)
	}
	clone := func() *specs.Spec {
		c := *cs
		p := *cs.Process
		p.Env = slices.Clone(p.Env)
		c.Process = &p
		return &c
	}
	p, err := e.processSpec(ctx, "c", clone(), executor.ExecSpec{Args: []string{"ls", "-l"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Args, []string{"ls", "-l"}) || p.Cwd != "/w" || p.User.UID != 5 || p.Terminal || !p.NoNewPrivileges {
		t.Errorf("defaults: %+v", p)
	}
	if p.OOMScoreAdj != nil {
		t.Errorf("exec inherits the init's oom_score_adj %d", *p.OOMScoreAdj)
	}
	if p.Capabilities == nil || !slices.Equal(p.Capabilities.Bounding, cs.Process.Capabilities.Bounding) {
		t.Errorf("capabilities not inherited")
	}
	p, err = e.processSpec(ctx, "c", clone(), executor.ExecSpec{Args: []string{"sh"}, Env: []string{"A=9", "B", "C=3"},
		Workdir: "/x", User: &executor.User{UID: 0, GID: 0}, TTY: true, Size: executor.WinSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Join(p.Env, " ")
	if !strings.Contains(env, "A=9") || strings.Contains(env, "B=") || !strings.Contains(env, "C=3") || strings.Count(env, "TERM=") != 1 {
		t.Errorf("env %v", p.Env)
	}
	if p.Cwd != "/x" || p.User.UID != 0 || !p.Terminal || p.ConsoleSize == nil || p.ConsoleSize.Height != 24 {
		t.Errorf("overrides: %+v", p)
	}
	p, err = e.processSpec(ctx, "c", clone(), executor.ExecSpec{Args: []string{"sh"}, TTY: true, Env: []string{"TERM=vt100"}})
	if err != nil {
		t.Fatal(err)
	}
	if env := strings.Join(p.Env, " "); strings.Count(env, "TERM=") != 1 || !strings.Contains(env, "TERM=vt100") {
		t.Errorf("TERM: %v", p.Env)
	}
}

func TestMountLeaves(t *testing.T) {
	ms := []specs.Mount{
		{Destination: "/proc"}, {Destination: "/dev"}, {Destination: "/dev/pts"}, {Destination: "/dev/shm"},
		{Destination: "/sys"}, {Destination: "/sys/fs/cgroup"}, {Destination: "/.esf/init"}, {Destination: "/mnt/x/"},
		{Destination: "/devices"}, // a sibling of /dev, not inside it
	}
	got := mountLeaves(ms)
	want := []string{"/proc", "/dev", "/sys", "/.esf/init", "/mnt/x", "/devices"}
	if !slices.Equal(got, want) {
		t.Fatalf("leaves %v, want %v", got, want)
	}
}

// TestFootprintRecordAndRemove: only what was absent is recorded; removal
// keeps what the sandbox put there and never follows a symlink out of the
// rootfs.
func TestFootprintRecordAndRemove(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(root, "proc"), 0o755))
	must(os.Symlink(outside, filepath.Join(root, "link")))
	must(os.WriteFile(filepath.Join(root, "file"), nil, 0o644))
	must(os.Mkdir(filepath.Join(outside, "x"), 0o755))

	leaves := []string{"/proc", "/dev", "/.esf/init", "/.esf/lower", "/link/x", "/file/y", "/a/b/c"}
	got, err := absentFootprint(root, leaves)
	must(err)
	want := []footprintEntry{{"/dev", "/dev"}, {"/.esf", "/.esf/init"}, {"/.esf", "/.esf/lower"}, {"/a", "/a/b/c"}}
	if !slices.Equal(got, want) {
		t.Fatalf("recorded %v, want %v", got, want)
	}

	// What runc would make, plus what a sandbox wrote into one of them.
	must(os.Mkdir(filepath.Join(root, "dev"), 0o755))
	must(os.MkdirAll(filepath.Join(root, ".esf", "lower"), 0o755))
	must(os.WriteFile(filepath.Join(root, ".esf", "init"), nil, 0o644))
	must(os.MkdirAll(filepath.Join(root, "a", "b", "c"), 0o755))
	must(os.WriteFile(filepath.Join(root, "a", "b", "mine"), []byte("x"), 0o644))
	for _, e := range got {
		must(removeCreated(root, e))
	}
	for p, exists := range map[string]bool{"/dev": false, "/.esf": false, "/a/b/c": false, "/a/b/mine": true, "/proc": true} {
		_, err := os.Lstat(filepath.Join(root, p))
		if (err == nil) != exists {
			t.Errorf("%s exists=%v after removal, want %v", p, err == nil, exists)
		}
	}

	// A footprint entry that reaches through a symlink removes nothing.
	must(removeCreated(root, footprintEntry{Top: "/link", Leaf: "/link/x"}))
	must(removeCreated(root, footprintEntry{Top: "/link/x", Leaf: "/link/x"}))
	if _, err := os.Stat(filepath.Join(outside, "x")); err != nil {
		t.Fatalf("removal followed a symlink out of the rootfs: %v", err)
	}
	// A non-empty file at a leaf is the sandbox's.
	must(os.MkdirAll(filepath.Join(root, "q"), 0o755))
	must(os.WriteFile(filepath.Join(root, "q", "init"), []byte("data"), 0o644))
	must(removeCreated(root, footprintEntry{Top: "/q", Leaf: "/q/init"}))
	if _, err := os.Stat(filepath.Join(root, "q", "init")); err != nil {
		t.Fatal("removed a non-empty file")
	}
	if err := removeCreated(root, footprintEntry{Top: "/z", Leaf: "/q/init"}); err == nil {
		t.Fatal("accepted a top that is not an ancestor")
	}
}

func TestParseStat(t *testing.T) {
	line := "4242 (a) b) (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
	st, err := parseStat(4242, []byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if st != (procStat{pid: 4242, ppid: 17, sid: 4242, state: 'S', start: 987654}) {
		t.Fatalf("parsed %+v", st)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "1 (x) S a 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 0 0 0 5"} {
		if _, err := parseStat(1, []byte(bad)); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}

func TestVictims(t *testing.T) {
	// 10: init (own session). 20: the exec (session leader). 21, 22: its
	// children; 23: grandchild that called setsid; 30: another exec; 31:
	// a zombie of the exec's session; 40: orphan of the exec's session
	// reparented to init.
	procs := map[int]procStat{
		10: {pid: 10, ppid: 1, sid: 10, state: 'S'},
		20: {pid: 20, ppid: 5, sid: 20, state: 'S'},
		21: {pid: 21, ppid: 20, sid: 20, state: 'S'},
		22: {pid: 22, ppid: 20, sid: 20, state: 'R'},
		23: {pid: 23, ppid: 22, sid: 23, state: 'S'},
		30: {pid: 30, ppid: 6, sid: 30, state: 'S'},
		31: {pid: 31, ppid: 10, sid: 20, state: 'Z'},
		40: {pid: 40, ppid: 10, sid: 20, state: 'S'},
	}
	var got []int
	for _, v := range victims(procs, 20, map[int]bool{20: true}) {
		got = append(got, v.pid)
	}
	slices.Sort(got)
	if want := []int{20, 21, 22, 23, 40}; !slices.Equal(got, want) {
		t.Fatalf("victims %v, want %v", got, want)
	}
}
