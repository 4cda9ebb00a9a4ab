package fabric

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/journal"
)

// unmountRetry bounds how long the release of a stopped container's root
// waits for the root to be free before it detaches it.
var unmountRetry = 5 * time.Second // a variable for tests

// unmountRoot unmounts an attempt's root. For a runc attempt the container
// has stopped (every process of it is gone), so a root still busy is held
// by what the kernel has not finished tearing down, or by a short-lived
// host process that passed through it: the unmount is retried, and after
// unmountRetry detached (MNT_DETACH: gone from every mount table at once,
// freed by the kernel when the last reference goes), so that a committed
// seal or release never fails on it and no mount outlives the attempt. A
// busy root of an attempt without a container is the caller's own process
// inside it: that fails with ErrFailedPrecondition, as it must.
func (f *Fabric) unmountRoot(a journal.Attempt, root string) error {
	err := f.unmountOnce(root, 0)
	if err == nil || a.Executor != ExecutorRunc || f.exec == nil || !errors.Is(err, cas.ErrFailedPrecondition) {
		return err
	}
	f.log.Info("release: root of a stopped container busy, retrying", "attempt_id", a.AttemptID, "holders", mountHolders(root))
	deadline := time.Now().Add(unmountRetry)
	for wait := 2 * time.Millisecond; time.Now().Before(deadline); wait = min(2*wait, 200*time.Millisecond) {
		time.Sleep(wait)
		if err = f.unmountOnce(root, 0); err == nil || !errors.Is(err, cas.ErrFailedPrecondition) {
			return err
		}
	}
	f.log.Warn("release: root of a stopped container still busy, detaching it", "attempt_id", a.AttemptID,
		"after", unmountRetry, "holders", mountHolders(root))
	return f.unmountOnce(root, unix.MNT_DETACH)
}

// unmountOnce unmounts root once, under its mount lock.
func (f *Fabric) unmountOnce(root string, flags int) error {
	defer f.lockMount(root)()
	if flags == 0 {
		return f.mounter.Unmount(root)
	}
	return f.mounter.Detach(root)
}

// mountHolders names the processes whose working directory, root or open
// files are under root, for the log of a busy unmount.
func mountHolders(root string) []string {
	var out []string
	procs, _ := os.ReadDir("/proc")
	under := func(p string) bool { return p == root || strings.HasPrefix(p, root+"/") }
	for _, e := range procs {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
		what := []string{}
		for _, l := range []string{"cwd", "root"} {
			if p, err := os.Readlink(filepath.Join(dir, l)); err == nil && under(p) {
				what = append(what, l)
			}
		}
		fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
		for _, fd := range fds {
			if p, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil && under(p) {
				what = append(what, "fd "+fd.Name()+" "+p)
			}
		}
		if len(what) > 0 {
			out = append(out, fmt.Sprintf("%s(%s): %s", e.Name(), strings.TrimSpace(string(comm)), strings.Join(what, ", ")))
		}
	}
	return out
}
