package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// poolContainers lists the warm pool's containers runc knows in the
// daemon's state (esfd's runc root is <state>/executor/runc).
func poolContainers(t *testing.T, state string) []string {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(state, "executor", "runc"), "list", "-q").Output()
	if err != nil {
		return []string{"(runc list: " + err.Error() + ")"}
	}
	var ids []string
	for _, id := range strings.Fields(string(out)) {
		if strings.HasPrefix(id, "esf-pool-") {
			ids = append(ids, id)
		}
	}
	return ids
}

// TestRuncPool_CrashedDaemonsIdleContainersReaped: esfd --runc-pool 2 is
// killed (SIGKILL) with its idle containers started, and restarted on the
// same state without a pool: the old idle containers are stopped, not left
// running beside the new daemon, outside its quota, for its whole life; an
// activation then starts cold and works.
func TestRuncPool_CrashedDaemonsIdleContainersReaped(t *testing.T) {
	requireRunc(t)
	d := startDaemonWith(t, "", "--runc-pool", "2")
	g := createGroup(t, d, busyboxTree(t, d))
	waitUntil(t, "two idle pool containers", func() bool { return len(poolContainers(t, d.state)) == 2 })
	d.cmd.Process.Kill()
	<-d.exited

	d2 := startDaemon(t, d.state)
	waitUntil(t, "the crashed daemon's pool containers to be stopped", func() bool { return len(poolContainers(t, d.state)) == 0 })
	a := activate(t, d2, g.Node.NodeID, "--executor", "runc")
	if r := d2.mustCtl(nil, "exec", a.AttemptID, "--", "sh", "-c", "echo ok"); r.stdout != "ok\n" {
		t.Fatalf("exec: %q", r.stdout)
	}
	d2.mustCtl(nil, "release", a.AttemptID)
	if left := poolContainers(t, d.state); len(left) != 0 {
		t.Fatalf("pool containers with the pool off: %v", left)
	}
}
