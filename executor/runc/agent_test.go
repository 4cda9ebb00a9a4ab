package runc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/executor"
)

// TestExecThroughInit: an exec with the container's user and no terminal
// is started by the init (its parent is PID 1; runc exec's is outside the
// pid namespace, 0), and sees exactly what runc exec would give it:
// environment, HOME, capabilities, no-new-privileges, seccomp, cgroup,
// rlimits, umask, open fds, and a killable OOM score while the init stays
// exempt. Another user, a terminal, or a container whose init has no
// socket go through runc exec.
func TestExecThroughInit(t *testing.T) {
	v := newEnv(t)
	v.start("agent", executor.Spec{
		Env:     []string{"FOO=container"},
		Workdir: "/tmp",
		User:    executor.User{UID: 1000, GID: 1001},
		Limits:  executor.Limits{Pids: 64, MemoryBytes: 64 << 20},
	})
	ppid := func(x executor.ExecSpec) string {
		t.Helper()
		r := v.run(v.ctx, "agent", x, "sh", "-c", "echo $PPID")
		if r.err != nil || r.code != 0 {
			t.Fatalf("exec: %d %v %q", r.code, r.err, r.stderr)
		}
		return strings.TrimSpace(strings.ReplaceAll(r.stdout, "\r", ""))
	}
	if got := ppid(executor.ExecSpec{}); got != "1" {
		t.Errorf("default exec: parent %s, want the init (1)", got)
	}
	// runc exec enters the workdir before it drops privileges; the init
	// cannot, so such an exec goes to runc.
	if err := os.Mkdir(filepath.Join(v.rootfs, "locked"), 0o700); err != nil {
		t.Fatal(err)
	}
	r := v.run(v.ctx, "agent", executor.ExecSpec{Workdir: "/locked"}, "sh", "-c", "echo $PPID; pwd")
	if r.err != nil || r.stdout != "0\n/locked\n" {
		t.Errorf("exec in a workdir the user may not enter: %q %v; want runc exec's \"0\\n/locked\\n\"", r.stdout, r.err)
	}
	same := &executor.User{UID: 1000, GID: 1001}
	if got := ppid(executor.ExecSpec{User: same}); got != "1" {
		t.Errorf("exec as the container's user, named: parent %s, want the init (1)", got)
	}
	if got := ppid(executor.ExecSpec{User: &executor.User{}}); got != "0" {
		t.Errorf("exec as another user: parent %s, want runc exec (0)", got)
	}
	if got := ppid(executor.ExecSpec{TTY: true}); got != "0" {
		t.Errorf("exec on a terminal: parent %s, want runc exec (0)", got)
	}

	// Each exec has a cgroup of its own (execcgroup.go): same place, another name.
	const probe = `env | grep -v '^PPID=' | sort; echo "home=$HOME"; cat /proc/self/oom_score_adj; ls /proc/self/fd; ` +
		`grep -E '^(Cap|NoNewPrivs|Seccomp|Groups|Uid|Gid)' /proc/self/status; umask; ulimit -a; ` +
		`sed 's/exec-[0-9]*/exec-N/' /proc/self/cgroup; id; pwd`
	viaInit := v.sh(t, "agent", probe)
	v.e.noAgent = true
	viaRunc := v.sh(t, "agent", probe)
	v.e.noAgent = false
	if viaInit != viaRunc {
		t.Errorf("the init's exec differs from runc exec's:\n--- init\n%s\n--- runc\n%s", viaInit, viaRunc)
	}
	if !strings.Contains(viaInit, "\n0\n0\n1\n2\n3\n") && !strings.Contains(viaInit, "home=/\n0\n0\n1\n2\n3\n") {
		t.Errorf("want OOM score 0 and fds 0-3 (ls's own), got:\n%s", viaInit)
	}
	// The same for a root container, whose init holds capabilities.
	v.start("agent-root", executor.Spec{})
	rootInit := v.sh(t, "agent-root", probe)
	v.e.noAgent = true
	rootRunc := v.sh(t, "agent-root", probe)
	v.e.noAgent = false
	if rootInit != rootRunc || !strings.Contains(rootInit, "uid=0") {
		t.Errorf("root: the init's exec differs from runc exec's:\n--- init\n%s\n--- runc\n%s", rootInit, rootRunc)
	}
	if canLowerOOMScore() {
		if got := strings.TrimSpace(v.sh(t, "agent", "cat /proc/1/oom_score_adj")); got != "-1000" {
			t.Errorf("the init's OOM score is %s, want -1000", got)
		}
	}

	// An init without a socket (a container of an older executor) still
	// runs execs, through runc.
	if err := os.Remove(filepath.Join(v.e.bundle("agent"), agentSocket)); err != nil {
		t.Fatal(err)
	}
	if got := ppid(executor.ExecSpec{}); got != "0" {
		t.Errorf("exec without the init's socket: parent %s, want runc exec (0)", got)
	}
}
