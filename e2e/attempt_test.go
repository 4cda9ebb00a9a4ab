package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/internal/testenv"
)

func requireFUSE(t *testing.T) {
	t.Helper()
	requireRoot(t)
	testenv.Require(t, "fuse", "overlay") // attempts mount both
}

type attemptJSON struct {
	AttemptID    string `json:"attempt_id"`
	NodeID       string `json:"node_id"`
	State        string `json:"state"`
	LeaseID      string `json:"lease_id"`
	ResultNodeID string `json:"result_node_id"`
	Root         string `json:"root"`
	Lease        *struct {
		Token     uint64 `json:"token"`
		TTLMillis int64  `json:"ttl_ms"`
	} `json:"lease"`
}

func activate(t *testing.T, d *daemon, node string, args ...string) attemptJSON {
	t.Helper()
	var a attemptJSON
	decode(t, d.mustCtl(nil, append([]string{"-o", "json", "activate", node}, args...)...), &a)
	if a.State != "active" || a.Root == "" || a.Lease == nil {
		t.Fatalf("activate %s: %+v", node, a)
	}
	return a
}

type suspendJSON struct {
	Node    nodeJSON    `json:"node"`
	Attempt attemptJSON `json:"attempt"`
}

func suspend(t *testing.T, d *daemon, attempt string, args ...string) suspendJSON {
	t.Helper()
	var s suspendJSON
	decode(t, d.mustCtl(nil, append([]string{"-o", "json", "suspend", attempt}, args...)...), &s)
	if s.Node.Status != "sealed" {
		t.Fatalf("suspend %s: %+v", attempt, s)
	}
	return s
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mounted reports whether something is mounted exactly at dir.
func mounted(dir string) bool {
	return exec.Command("findmnt", "-rn", "--mountpoint", dir).Run() == nil
}

// TestAttemptVerbs: activate a draft, write under its root, suspend (the
// draft becomes sealed with the write), a new attempt sees it; a lease
// renewed with a stale token is exit 5; release; retry of a live attempt
// is refused.
func TestAttemptVerbs(t *testing.T) {
	requireFUSE(t)
	d := startDaemon(t)
	g := createGroup(t, d, smallTree(t, d, map[string]string{"base.txt": "base\n"}))
	kids := fork(t, d, g.Node.NodeID, 2)

	a := activate(t, d, kids[0], "--ttl", "2m")
	if a.Lease.TTLMillis != 120_000 || !mounted(a.Root) {
		t.Fatalf("attempt %+v (mounted %v)", a, mounted(a.Root))
	}
	if got := readFile(t, filepath.Join(a.Root, "base.txt")); got != "base\n" {
		t.Fatalf("attempt root shows %q", got)
	}
	writeFile(t, filepath.Join(a.Root, "result.txt"), "computed\n")
	if err := os.Remove(filepath.Join(a.Root, "base.txt")); err != nil {
		t.Fatal(err)
	}
	// A sibling attempt does not see it.
	b := activate(t, d, kids[1])
	if _, err := os.Stat(filepath.Join(b.Root, "result.txt")); err == nil {
		t.Fatal("a sibling sees an unsealed write")
	}

	r := d.ctl(nil, "-o", "json", "lease", "renew", a.LeaseID, "--token", strconv.FormatUint(a.Lease.Token+100, 10))
	if r.code != 5 {
		t.Fatalf("renew with a stale token: exit %d (%s)", r.code, r.stderr)
	}
	if r := d.mustCtl(nil, "lease", "renew", a.LeaseID, "--token", strconv.FormatUint(a.Lease.Token, 10), "--ttl", "5m"); !strings.Contains(r.stdout, a.LeaseID) {
		t.Fatalf("lease renew: %s", r.stdout)
	}

	s := suspend(t, d, a.AttemptID, "--logical-state", `{"done":true}`)
	if s.Node.NodeID != kids[0] || s.Attempt.State != "released" || compact(s.Node.LogicalState) != `{"done":true}` {
		t.Fatalf("suspend: %+v", s)
	}
	if mounted(a.Root) {
		t.Fatal("a suspended attempt's root is still mounted")
	}
	n, _ := inspectNode(t, d, kids[0])
	if n.Status != "sealed" || n.RootID == g.Node.RootID {
		t.Fatalf("sealed draft: %+v", n)
	}
	c := activate(t, d, kids[0])
	if got := readFile(t, filepath.Join(c.Root, "result.txt")); got != "computed\n" {
		t.Fatalf("new attempt reads %q", got)
	}
	if _, err := os.Stat(filepath.Join(c.Root, "base.txt")); err == nil {
		t.Fatal("a deleted file came back")
	}
	// A sealed node gets a new child from a seal.
	writeFile(t, filepath.Join(c.Root, "more.txt"), "more\n")
	s2 := suspend(t, d, c.AttemptID)
	if s2.Node.NodeID == kids[0] || len(s2.Node.Parents) != 1 || s2.Node.Parents[0] != kids[0] {
		t.Fatalf("seal of a sealed node: %+v", s2.Node)
	}

	r = d.ctl(nil, "-o", "json", "retry", b.AttemptID)
	if r.code != 6 {
		t.Fatalf("retry of a live attempt: exit %d (%s)", r.code, r.stderr)
	}
	var rel attemptJSON
	decode(t, d.mustCtl(nil, "-o", "json", "release", b.AttemptID), &rel)
	if rel.State != "released" || mounted(b.Root) {
		t.Fatalf("release: %+v", rel)
	}
	var re attemptJSON
	decode(t, d.mustCtl(nil, "-o", "json", "retry", b.AttemptID), &re)
	if re.State != "active" || re.NodeID != kids[1] || re.AttemptID == b.AttemptID {
		t.Fatalf("retry: %+v", re)
	}
	if r := d.mustCtl(nil, "inspect", re.AttemptID); !strings.Contains(r.stdout, "retry_of") || !strings.Contains(r.stdout, b.AttemptID) {
		t.Fatalf("inspect of a retry:\n%s", r.stdout)
	}

	// The daemon's lease reaper fails an attempt whose lease expires and
	// unmounts its root.
	e := activate(t, d, kids[1], "--ttl", "1s")
	deadline := time.Now().Add(15 * time.Second)
	for {
		var in struct {
			Attempt attemptJSON `json:"attempt"`
		}
		decode(t, d.mustCtl(nil, "-o", "json", "inspect", e.AttemptID), &in)
		if in.Attempt.State == "failed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("attempt with a 1s lease is %s after 15s", in.Attempt.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if mounted(e.Root) {
		t.Fatal("an expired attempt's root is still mounted")
	}
}

// TestMountVerbs: mount NODE DIR shows the node read-only; mount --rw makes
// DIR an attempt's root; umount undoes both; a non-empty, a busy or an
// occupied directory is refused with failed_precondition (exit 6).
func TestMountVerbs(t *testing.T) {
	requireFUSE(t)
	d := startDaemon(t)
	g := createGroup(t, d, smallTree(t, d, map[string]string{"doc/readme": "read me\n"}))
	base := filepath.Dir(d.state)
	ro, rw, full := filepath.Join(base, "ro"), filepath.Join(base, "rw"), filepath.Join(base, "full")
	for _, dir := range []string{ro, rw, full} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(full, "x"), "occupied")

	// A relative DIR is made absolute by esfctl.
	rel, err := filepath.Rel(mustGetwd(t), ro)
	if err != nil {
		t.Fatal(err)
	}
	if r := d.mustCtl(nil, "mount", g.Node.NodeID, rel); !strings.Contains(r.stdout, "read-only at "+ro) {
		t.Fatalf("mount: %s", r.stdout)
	}
	if got := readFile(t, filepath.Join(ro, "doc/readme")); got != "read me\n" {
		t.Fatalf("read-only mount shows %q", got)
	}
	if err := os.WriteFile(filepath.Join(ro, "new"), nil, 0o644); err == nil {
		t.Fatal("wrote into a read-only mount")
	}
	for _, tt := range []struct {
		name string
		args []string
		code int
	}{
		{"non-empty dir", []string{"mount", g.Node.NodeID, full}, 6},
		{"dir already mounted", []string{"mount", g.Node.NodeID, ro}, 6},
		{"rw on a non-empty dir", []string{"mount", "--rw", g.Node.NodeID, full}, 6},
		{"missing dir", []string{"mount", g.Node.NodeID, filepath.Join(base, "absent")}, 3},
		{"umount of a plain dir", []string{"umount", full}, 3},
	} {
		if r := d.ctl(nil, append(tt.args, "-o", "json")...); r.code != tt.code {
			t.Errorf("%s: exit %d, want %d (%s)", tt.name, r.code, tt.code, r.stderr)
		}
	}
	// A busy mount is not unmounted.
	busy := exec.Command("sleep", "60")
	busy.Dir = ro
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	r := d.ctl(nil, "-o", "json", "umount", ro)
	busy.Process.Kill()
	busy.Wait()
	if r.code != 6 || !mounted(ro) {
		t.Fatalf("umount of a busy mount: exit %d (%s), mounted %v", r.code, r.stderr, mounted(ro))
	}
	d.mustCtl(nil, "umount", ro)
	if mounted(ro) {
		t.Fatal("still mounted after umount")
	}

	// --rw: an attempt rooted at the directory.
	var m struct {
		Dir     string       `json:"dir"`
		Attempt *attemptJSON `json:"attempt"`
	}
	decode(t, d.mustCtl(nil, "-o", "json", "mount", "--rw", g.Node.NodeID, rw), &m)
	if m.Attempt == nil || m.Attempt.Root != rw || m.Dir != rw || !mounted(rw) {
		t.Fatalf("mount --rw: %+v", m)
	}
	writeFile(t, filepath.Join(rw, "doc/readme"), "changed\n")
	if r := d.mustCtl(nil, "umount", rw); !strings.Contains(r.stdout, m.Attempt.AttemptID) || !strings.Contains(r.stdout, "released") {
		t.Fatalf("umount --rw: %s", r.stdout)
	}
	if mounted(rw) {
		t.Fatal("rw root still mounted after umount")
	}
	// Released, not sealed: the node is unchanged.
	if n, _ := inspectNode(t, d, g.Node.NodeID); n.RootID != g.Node.RootID {
		t.Fatalf("umount sealed the attempt: %+v", n)
	}
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

// projectionPid reads the pid file the daemon keeps for the projection
// server.
func projectionPid(t *testing.T, d *daemon) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.state, "fuse-server.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil && !isZombie(pid) }

// TestRestartWithLiveAttempts (issue 4): an attempt survives its daemon.
// After a SIGTERM and after a SIGKILL of esfd (not of the projection
// server), a new esfd on the same state adopts the running projection
// server; the attempt's root stays mounted and usable (read and write,
// even while no daemon runs), and suspend seals what was written before
// and after the restart.
func TestRestartWithLiveAttempts(t *testing.T) {
	requireFUSE(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			d := startDaemon(t)
			g := createGroup(t, d, smallTree(t, d, map[string]string{"base.txt": "base\n"}))
			kids := fork(t, d, g.Node.NodeID, 1)
			a := activate(t, d, kids[0])
			writeFile(t, filepath.Join(a.Root, "before.txt"), "written before the restart\n")
			server := projectionPid(t, d)

			if err := d.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-d.exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("esfd did not exit on %v", sig)
			}
			if !alive(server) {
				t.Fatalf("the projection server (pid %d) died with esfd", server)
			}
			// Usable with no daemon at all: the kernel and the projection
			// server serve it.
			if !mounted(a.Root) {
				t.Fatal("the attempt root was unmounted with esfd")
			}
			if got := readFile(t, filepath.Join(a.Root, "base.txt")); got != "base\n" {
				t.Fatalf("lower layer without a daemon: %q", got)
			}
			writeFile(t, filepath.Join(a.Root, "between.txt"), "written while no daemon ran\n")

			again := startDaemon(t, d.state)
			if got := projectionPid(t, again); got != server || !alive(server) {
				t.Fatalf("projection server %d after restart, want the adopted %d", got, server)
			}
			var in struct {
				Attempt attemptJSON `json:"attempt"`
			}
			decode(t, again.mustCtl(nil, "-o", "json", "inspect", a.AttemptID), &in)
			if in.Attempt.State != "active" || in.Attempt.Root != a.Root {
				t.Fatalf("attempt after restart: %+v", in.Attempt)
			}
			if got := readFile(t, filepath.Join(a.Root, "before.txt")); got != "written before the restart\n" {
				t.Fatalf("after restart: %q", got)
			}
			writeFile(t, filepath.Join(a.Root, "after.txt"), "written after the restart\n")
			s := suspend(t, again, a.AttemptID)
			if s.Node.NodeID != kids[0] || s.Attempt.State != "released" {
				t.Fatalf("suspend after restart: %+v", s)
			}
			c := activate(t, again, kids[0])
			for name, want := range map[string]string{
				"base.txt":    "base\n",
				"before.txt":  "written before the restart\n",
				"between.txt": "written while no daemon ran\n",
				"after.txt":   "written after the restart\n",
			} {
				if got := readFile(t, filepath.Join(c.Root, name)); got != want {
					t.Errorf("%s in the sealed child: %q, want %q", name, got, want)
				}
			}
			// c stays live: the teardown (esfd stop-all) must end it and
			// the projection server.
		})
	}
}
