package runc

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Stop without runc's waits. runc delete --force sends the init SIGKILL
// and then checks for its exit every 100 ms (runc 1.1): a tenth of a
// second at least, that every release paid, plus a runc invocation (tens
// of milliseconds of a loaded machine's time). Stop instead kills the
// init itself and awaits its exit on a pidfd (killInit), then removes
// what runc's delete of a stopped container removes (removeStopped).
// Whatever these cannot do, or find unexpected, is left to runc delete
// --force, as before.

// runcState is what Stop reads of runc's state of a container
// (<root>/<id>/state.json, libcontainer's State).
type runcState struct {
	Pid         int               `json:"init_process_pid"`
	Start       uint64            `json:"init_process_start"`
	CgroupPaths map[string]string `json:"cgroup_paths"`
	IntelRdt    string            `json:"intel_rdt_path"`
	Config      struct {
		Namespaces []struct {
			Type string `json:"type"`
			Path string `json:"path"`
		} `json:"namespaces"`
		Hooks map[string]json.RawMessage `json:"Hooks"`
	} `json:"config"`
}

func (e *Executor) readState(rid string) (runcState, error) {
	var st runcState
	err := readJSON(filepath.Join(e.rc.Root, rid, "state.json"), &st)
	return st, err
}

// killInit SIGKILLs a running container's init (its pid and start time
// from runc's state, proven by a pidfd opened before the start time is
// compared), thaws its freezer (cgroup v1 delivers a frozen task's
// SIGKILL only once thawed; runc thaws too), and waits until the pidfd
// says the init and its threads have exited. The init is PID 1 of the
// container's own pid namespace: before its exit completes, the kernel
// kills every other process of the namespace and waits until they are
// reaped, so none is left after it, whatever they ignore or fork.
//
// It reports whether the init is gone; false (a pid namespace shared
// with others, a failure, the wait timed out) leaves it to runc.
func (e *Executor) killInit(rid string, st runcState, timeout time.Duration) bool {
	if !st.ownPidNS() || st.Pid <= 0 {
		return false
	}
	fd, err := unix.PidfdOpen(st.Pid, 0)
	if err != nil {
		return errors.Is(err, unix.ESRCH) // gone, and reaped
	}
	defer unix.Close(fd)
	if now, err := readStat(st.Pid); err != nil || now.start != st.Start {
		// The init is gone: the pid is free, or another process's (the
		// pidfd, opened first, pins the process it compares).
		return err == nil || errors.Is(err, os.ErrNotExist)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return false
	}
	if f, ok := freezerOf("/" + e.opts.Namespace + "/" + rid); ok {
		os.WriteFile(f.state, []byte(f.off), 0)
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(min(left, time.Second)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if n > 0 {
			return true
		}
	}
}

// ownPidNS reports whether the container has a pid namespace of its own
// (the executor's spec always gives it one).
func (st runcState) ownPidNS() bool {
	for _, ns := range st.Config.Namespaces {
		if ns.Type == "NEWPID" {
			return ns.Path == ""
		}
	}
	return false
}

// removeStopped does what runc delete does with a stopped container
// (runc 1.1's destroy) whose pid namespace was its own: it removes the
// container's cgroups, sub-cgroups first (the execs', execcgroup.go), as
// runc does, retrying while the kernel still counts a task that has just
// exited, then runc's state dir. A state with something more to undo
// (poststop hooks, Intel RDT, a cgroup outside /sys/fs/cgroup) is refused,
// for runc. The cgroups go first: if they cannot, runc's state is still
// there for runc delete to try again.
func (e *Executor) removeStopped(rid string, st runcState) error {
	if h := strings.TrimSpace(string(st.Config.Hooks["poststop"])); h != "" && h != "null" && h != "[]" {
		return errors.New("the container has poststop hooks")
	}
	if st.IntelRdt != "" || !st.ownPidNS() {
		return errors.New("not a container of this executor's spec")
	}
	for _, p := range st.CgroupPaths {
		if !strings.HasPrefix(p, "/sys/fs/cgroup/") || strings.Contains(p, "/../") {
			return fmt.Errorf("cgroup path %q", p)
		}
	}
	left := maps.Clone(st.CgroupPaths)
	for try, delay := 0, 5*time.Millisecond; ; try, delay = try+1, delay*2 {
		var err error
		for k, p := range left {
			if err = removeCgroup(p); err == nil {
				delete(left, k)
			}
		}
		if len(left) == 0 {
			break
		}
		if try == 5 {
			return fmt.Errorf("remove cgroup: %w", err)
		}
		time.Sleep(delay)
	}
	return os.RemoveAll(filepath.Join(e.rc.Root, rid))
}

// removeCgroup removes cgroup dir p and every cgroup below it, deepest
// first; a cgroup that is not there is removed.
func removeCgroup(p string) error {
	err := unix.Rmdir(p)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	ents, rerr := os.ReadDir(p)
	if rerr != nil {
		if errors.Is(rerr, os.ErrNotExist) {
			return nil
		}
		return rerr
	}
	for _, d := range ents {
		if d.IsDir() {
			if err := removeCgroup(filepath.Join(p, d.Name())); err != nil {
				return err
			}
		}
	}
	if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// initPidfd opens a pidfd of container rid's init, found in runc's state
// (no runc invocation: runc state costs a pool refill tens of
// milliseconds), and proves with the start time, read after the pidfd
// was opened, that it is that init and that it runs.
func (e *Executor) initPidfd(rid string) (pid, pidfd int, err error) {
	st, err := e.readState(rid)
	if err != nil {
		return 0, -1, err
	}
	if st.Pid <= 0 {
		return 0, -1, fmt.Errorf("container %s has no init", rid)
	}
	fd, err := unix.PidfdOpen(st.Pid, 0)
	if err != nil {
		return 0, -1, fmt.Errorf("container %s's init: %w", rid, err)
	}
	now, err := readStat(st.Pid)
	if err == nil && (now.start != st.Start || now.state == 'Z' || now.state == 'X') {
		err = fmt.Errorf("container %s's init has exited", rid)
	}
	if err != nil {
		unix.Close(fd)
		return 0, -1, err
	}
	return st.Pid, fd, nil
}
