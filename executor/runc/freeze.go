package runc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/esf-dev/esf/executor"
)

// cgroupFreezer freezes a container's cgroup by writing its freezer file
// directly, as runc pause and resume do, without a runc invocation (tens
// of milliseconds each): seal --keep-running of a container freezes and
// thaws once per checkpoint. runc computes a container's paused state from
// the same cgroup, so its view (State, delete --force) stays right.
type cgroupFreezer struct {
	v2          bool
	procs       string // the cgroup's cgroup.procs
	state       string // v1 freezer.state, v2 cgroup.freeze
	events      string // v2 cgroup.events
	freeze, off string // what to write
}

// freezerOf finds the freezer of a container's cgroup, under cgroup v1 or
// v2; ok is false when neither is there (a stopped container, or a cgroup
// layout this executor does not know: runc is asked instead).
func freezerOf(cgroupsPath string) (cgroupFreezer, bool) {
	if !strings.HasPrefix(cgroupsPath, "/") {
		return cgroupFreezer{}, false
	}
	v1 := filepath.Join("/sys/fs/cgroup/freezer", cgroupsPath, "freezer.state")
	if _, err := os.Stat(v1); err == nil {
		return cgroupFreezer{state: v1, procs: filepath.Join(filepath.Dir(v1), "cgroup.procs"), freeze: "FROZEN", off: "THAWED"}, true
	}
	dir := filepath.Join("/sys/fs/cgroup", cgroupsPath)
	if _, err := os.Stat(filepath.Join(dir, "cgroup.freeze")); err == nil {
		return cgroupFreezer{v2: true, state: filepath.Join(dir, "cgroup.freeze"), events: filepath.Join(dir, "cgroup.events"),
			procs: filepath.Join(dir, "cgroup.procs"), freeze: "1", off: "0"}, true
	}
	return cgroupFreezer{}, false
}

// set freezes (or thaws) and waits until every task has stopped. A freeze
// that does not complete within timeout (or before ctx ends) is undone and
// fails.
//
// A freeze can deadlock: a thread in execve waits (uninterruptibly) for
// its sibling threads to exit, and they are frozen first and never do
// (seen with runc's init right after a start, and possible for any
// multithreaded program in the sandbox). So a freeze that has not
// completed after a while is thawed for a moment, letting such an exec
// finish, and tried again, with growing patience; the total wait is
// generous, since on a loaded machine a task stops only when next
// scheduled.
func (f cgroupFreezer) set(ctx context.Context, frozen bool, timeout time.Duration) error {
	val := f.off
	if frozen {
		val = f.freeze
	}
	if err := os.WriteFile(f.state, []byte(val), 0); err != nil {
		return err
	}
	if !frozen {
		return nil // thawing takes effect at once
	}
	deadline := time.Now().Add(timeout)
	patience := 100 * time.Millisecond
	for {
		until := time.Now().Add(patience)
		if until.After(deadline) {
			until = deadline
		}
		done, err := f.await(ctx, until)
		if err != nil || done {
			if err != nil {
				os.WriteFile(f.state, []byte(f.off), 0)
			}
			return err
		}
		if time.Now().After(deadline) {
			diag := f.diagnose()
			os.WriteFile(f.state, []byte(f.off), 0)
			return fmt.Errorf("tasks did not stop within %v (uninterruptible sleep?): %s", timeout, diag)
		}
		// Thaw, let what was stuck run, freeze again.
		if err := os.WriteFile(f.state, []byte(f.off), 0); err != nil {
			return err
		}
		time.Sleep(patience / 10)
		if err := os.WriteFile(f.state, []byte(f.freeze), 0); err != nil {
			return err
		}
		patience = min(2*patience, 3*time.Second)
	}
}

// await polls until the freeze completes (true), ctx ends (its error) or
// the deadline passes (false).
func (f cgroupFreezer) await(ctx context.Context, deadline time.Time) (bool, error) {
	for wait := 50 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		done, err := f.frozen()
		if err != nil || done {
			return done, err
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(wait)
		if !f.v2 {
			// v1 may stay FREEZING while a task could not be stopped;
			// asking again retries those tasks (runc does the same).
			os.WriteFile(f.state, []byte(f.freeze), 0)
		}
	}
}

// frozen reports whether the freeze has completed.
func (f cgroupFreezer) frozen() (bool, error) {
	if f.v2 {
		b, err := os.ReadFile(f.events)
		if err != nil {
			return false, err
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "frozen "); ok {
				return strings.TrimSpace(v) == "1", nil
			}
		}
		return false, errors.New("cgroup.events has no frozen line")
	}
	b, err := os.ReadFile(f.state)
	return strings.TrimSpace(string(b)) == "FROZEN", err
}

// freezeCgroup freezes or thaws id through its cgroup; handled is false
// when that is not possible and runc must do it.
func (e *Executor) freezeCgroup(ctx context.Context, id string, frozen bool) (handled bool, err error) {
	if _, err := os.Lstat(e.bundle(id)); errors.Is(err, fs.ErrNotExist) {
		return true, fmt.Errorf("container %s: %w", id, executor.ErrNotFound)
	}
	// The spec puts every container at /<Namespace>/<id> (containerSpec).
	f, ok := freezerOf("/" + e.opts.Namespace + "/" + e.runcID(id))
	if !ok {
		return false, nil
	}
	// A cgroup without live tasks is a container that stopped (its init
	// died): runc says so with the right error. A dying process stays
	// listed, as a zombie, while its other threads exit.
	if !anyAlive(f.procs) {
		return false, nil
	}
	return true, f.set(ctx, frozen, e.opts.CommandTimeout)
}

// anyAlive reports whether a cgroup.procs file lists a process that is
// not a zombie.
func anyAlive(procs string) bool {
	b, err := os.ReadFile(procs)
	if err != nil {
		return false
	}
	for f := range strings.FieldsSeq(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if st, err := readStat(pid); err == nil && st.state != 'Z' && st.state != 'X' {
			return true
		}
	}
	return false
}

// diagnose describes the cgroup's threads for a freeze that did not
// complete: id, name, state and where each sleeps in the kernel.
func (f cgroupFreezer) diagnose() string {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(f.procs), "tasks"))
	if err != nil {
		b, err = os.ReadFile(filepath.Join(filepath.Dir(f.procs), "cgroup.threads"))
	}
	if err != nil {
		return err.Error()
	}
	var out []string
	for tid := range strings.FieldsSeq(string(b)) {
		stat, _ := os.ReadFile("/proc/" + tid + "/stat")
		wchan, _ := os.ReadFile("/proc/" + tid + "/wchan")
		st := string(stat)
		if i := strings.LastIndexByte(st, ')'); i > 0 && i+3 < len(st) {
			st = st[strings.IndexByte(st, '(')+1:i] + " " + st[i+2:i+3]
		}
		out = append(out, tid+" "+st+" "+string(wchan))
	}
	return strings.Join(out, "; ")
}
