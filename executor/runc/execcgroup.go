package runc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// execCgroup is an exec's own cgroup below its container's: the exec's
// process is put there before it runs its command, so everything it
// starts stays there whatever session or parent it takes (a daemon that
// double-forks and calls setsid included; the sandbox cannot move itself,
// its cgroup file system is read-only). Killing the exec kills the
// cgroup. Under cgroup v1 it lives in the freezer hierarchy, so the kill
// freezes it first and no process forks past it; under v2, cgroup.kill
// does that in the kernel. The container's limits still apply: a child
// counts against its parent in every controller, and one it is not in
// under v1 keeps it in the container's own cgroup.
type execCgroup struct {
	v2   bool
	dir  string // the cgroup's directory
	name string // relative to the container's cgroup
}

// newExecCgroup makes an exec cgroup in the container's; nil when the
// container's cgroup is not where this executor knows to look.
func newExecCgroup(cgroupsPath string) (*execCgroup, error) {
	if !strings.HasPrefix(cgroupsPath, "/") {
		return nil, nil
	}
	c := &execCgroup{}
	parent := filepath.Join("/sys/fs/cgroup/freezer", cgroupsPath)
	if _, err := os.Stat(filepath.Join(parent, "freezer.state")); err != nil {
		parent = filepath.Join("/sys/fs/cgroup", cgroupsPath)
		if _, err := os.Stat(filepath.Join(parent, "cgroup.kill")); err != nil {
			return nil, nil
		}
		c.v2 = true
	}
	dir, err := os.MkdirTemp(parent, "exec-")
	if err != nil {
		return nil, fmt.Errorf("exec cgroup: %w", err)
	}
	c.dir, c.name = dir, filepath.Base(dir)
	return c, nil
}

// runcArg is runc exec's --cgroup value for it.
func (c *execCgroup) runcArg() string {
	if c.v2 {
		return c.name
	}
	return "freezer:" + c.name
}

// add moves pid into the cgroup.
func (c *execCgroup) add(pid int) error {
	return os.WriteFile(filepath.Join(c.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// kill SIGKILLs every process of the cgroup. Under v1 the cgroup is frozen
// while its processes are listed and killed (a frozen process neither forks
// nor exits, so its pid names it), then thawed for the kills to land; a
// freeze that does not settle in time is killed as it stands, repeatedly.
func (c *execCgroup) kill(timeout time.Duration) error {
	if c.v2 {
		return os.WriteFile(filepath.Join(c.dir, "cgroup.kill"), []byte("1"), 0)
	}
	state := filepath.Join(c.dir, "freezer.state")
	deadline := time.Now().Add(timeout)
	for {
		os.WriteFile(state, []byte("FROZEN"), 0)
		for wait := 50 * time.Microsecond; time.Now().Before(deadline); wait = min(2*wait, 10*time.Millisecond) {
			if b, err := os.ReadFile(state); err != nil || strings.TrimSpace(string(b)) == "FROZEN" {
				break
			}
			time.Sleep(wait)
			os.WriteFile(state, []byte("FROZEN"), 0)
		}
		pids, err := c.pids()
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		os.WriteFile(state, []byte("THAWED"), 0)
		if err != nil || len(pids) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("exec cgroup: processes still there after the kill")
		}
		// Killed processes leave the cgroup once they are reaped; a new
		// pass catches any that forked before the freeze settled.
		for range 100 {
			if left, _ := c.pids(); len(left) == 0 {
				return nil
			}
			time.Sleep(time.Millisecond)
		}
	}
}

func (c *execCgroup) pids() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out, nil
}

// remove deletes the cgroup once it is empty; a cgroup that still holds
// background processes of the exec stays until they exit or the container
// is deleted (runc removes its cgroup with every child).
func (c *execCgroup) remove() {
	unix.Rmdir(c.dir)
}
