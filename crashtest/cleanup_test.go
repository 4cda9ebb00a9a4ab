package crashtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// mount is one mount below a test's directory.
type mount struct {
	point  string
	fstype string
	super  string // super options: an overlay's lowerdir, upperdir, workdir
}

// mountsUnder lists the mounts at or below dir, deepest first (so they can
// be unmounted in that order), a path mounted twice listed twice.
func mountsUnder(dir string) []mount {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil
	}
	var out []mount
	for _, in := range infos {
		out = append(out, mount{point: in.Mountpoint, fstype: in.FSType, super: in.VFSOptions})
	}
	// Later mounts stack on earlier ones; reverse mountinfo order, then
	// deepest path first.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Count(out[i].point, "/") > strings.Count(out[j].point, "/")
	})
	return out
}

// mountedAt returns the type of the visible mount exactly at p.
func mountedAt(p string) (string, bool) {
	for _, m := range mountsUnder(p) {
		if m.point == p {
			return m.fstype, true
		}
	}
	return "", false
}

// unmountAll detaches every mount under dir, deepest first. A busy mount
// gets a lazy detach as a last resort, which is reported: something still
// used it.
func unmountAll(dir string) []string {
	var notes []string
	for round := 0; round < 5; round++ {
		ms := mountsUnder(dir)
		if len(ms) == 0 {
			return notes
		}
		for _, m := range ms {
			err := unix.Unmount(m.point, 0)
			if errors.Is(err, unix.EBUSY) && round >= 2 {
				err = unix.Unmount(m.point, unix.MNT_DETACH)
				notes = append(notes, fmt.Sprintf("lazy unmount of busy %s (%s)", m.point, m.fstype))
			}
			_ = err // EINVAL: already gone with its parent; retried next round otherwise
		}
	}
	for _, m := range mountsUnder(dir) {
		notes = append(notes, fmt.Sprintf("cannot unmount %s (%s)", m.point, m.fstype))
	}
	return notes
}

// esfProcesses lists live processes running our esfd binary whose command
// line names something under dir (all of them if dir is empty). Only
// processes this test binary started, directly or through an esfd it
// started, run that binary: it is a fresh build in a temp dir. Both esfd
// and its projection server name their state dir on the command line.
func esfProcesses(dir string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || strings.TrimSuffix(exe, " (deleted)") != esfdBin || zombie(pid) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if dir == "" || strings.Contains(string(cmdline), dir+"/") {
			out = append(out, pid)
		}
	}
	return out
}

// zombie reports whether pid has exited and waits only to be reaped (or
// is gone).
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// killAndWait SIGKILLs pids and waits until they are gone.
func killAndWait(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for !zombie(pid) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// teardown removes whatever a case left under dir: with stopAll, first
// through `esfd stop-all` (on the journal mode and prefix say); then every
// mount (which ends the projection server), then esfd processes naming dir
// or the recorded projection pid. It returns what it had to remove by
// force.
func teardown(dir, state string, mode *journalMode, prefix string, stopAll bool) []string {
	var notes []string
	// esfd's own full teardown first (release every attempt, stop the
	// projection); then whatever it could not remove, by force.
	if stopAll && mode.exists(state) {
		args := append([]string{"stop-all", "--state", state, "--log-level", "error"}, mode.args(prefix)...)
		cmd := exec.Command(esfdBin, args...)
		cmd.Env = childEnv("")
		if out, err := cmd.CombinedOutput(); err != nil {
			notes = append(notes, fmt.Sprintf("esfd stop-all: %v: %s", err, strings.TrimSpace(string(out))))
		}
		for _, m := range mountsUnder(dir) {
			notes = append(notes, fmt.Sprintf("left by stop-all: %s (%s)", m.point, m.fstype))
		}
	}
	notes = append(notes, unmountAll(dir)...)
	// The projection server exits once its mount is gone; give it a moment
	// before killing it.
	deadline := time.Now().Add(5 * time.Second)
	var left []int
	for {
		left = esfProcesses(dir)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(left) > 0 {
		notes = append(notes, fmt.Sprintf("killed esfd processes %v", left))
		killAndWait(left)
		// A killed FUSE server leaves its mount dead (ENOTCONN).
		notes = append(notes, unmountAll(dir)...)
	}
	return notes
}

// sweep is teardown for the whole run: any mount under dir and any process
// of our binary at all.
func sweep(dir string) []string {
	var leaks []string
	for _, m := range mountsUnder(dir) {
		leaks = append(leaks, "mount "+m.point+" ("+m.fstype+")")
	}
	if pids := esfProcesses(""); len(pids) > 0 {
		leaks = append(leaks, fmt.Sprintf("esfd processes %v", pids))
		killAndWait(pids)
	}
	unmountAll(dir)
	return leaks
}
