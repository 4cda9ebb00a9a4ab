package runc

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/esf-dev/esf/executor"
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

// TestPool_SameBoundaryAsCold: a container adopted from the pool and one
// started cold on the same spec are the same seen from inside, field by
// field, through both ways an exec starts (the init, runc exec):
// credentials and capability sets, seccomp and its filter count,
// no-new-privileges, rlimits, OOM score, umask, the init's own status,
// open descriptors, root and working directory, the mount table with each
// mount's root (nothing of the pool's stub, its bundle or the adoption's
// mountpoint), and from the host every setting of their cgroups.
func TestPool_SameBoundaryAsCold(t *testing.T) {
	cold := newEnv(t)
	pooled := newEnvWith(t, Options{PoolSize: 1})
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
