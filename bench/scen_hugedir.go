package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/fabric"
)

// One directory of a million entries (issue 15): import, projection
// listing and export against cp -a and ls -f on ext4, and the peak memory
// each side of esf takes for it.
//
// The daemon runs in this process, so its peak is the process's VmHWM,
// reset (clear_refs) after a GC just before the import, minus what the
// process held then. The projection runs in its own child process: its
// VmHWM is its own. One repetition: a million files take minutes.

func init() {
	Register(Scenario{Name: "hugedir", Order: 96, Run: benchHugeDir})
}

func benchHugeDir(ctx context.Context, e *Env) error {
	n := e.Size(10_000, 1_000_000)
	work, err := e.Mkdir("hugedir")
	if err != nil {
		return err
	}
	src := filepath.Join(work, "src")
	if err := createEmpty(src, n); err != nil {
		return err
	}
	d, err := e.StartDaemon(ctx, "hugedir")
	if err != nil {
		return err
	}
	freeMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return fmt.Errorf("reset peak RSS: %w", err)
	}
	base := rssMiB()

	var root string
	imp, err := Timed(float64(n), func() error {
		r, err := d.Ops.Import(ctx, src)
		root = r.RootID
		if err != nil {
			return err
		}
		return syncfs(d.StateDir)
	})
	if err != nil {
		return err
	}
	cp, err := Timed(float64(n), func() error {
		if err := run(ctx, "cp", "-a", src, filepath.Join(work, "cp")); err != nil {
			return err
		}
		return syncfs(work)
	})
	if err != nil {
		return err
	}
	g, err := d.Ops.CreateGroup(ctx, root)
	if err != nil {
		return err
	}
	// A read-only view of the node, as esfctl mount makes it.
	view := filepath.Join(work, "view")
	if err := os.Mkdir(view, 0o755); err != nil {
		return err
	}
	if _, err := d.Fabric.Mount(ctx, fabric.MountRequest{NodeID: g.Node.NodeID, Dir: view}); err != nil {
		return err
	}
	e.Cleanup(func() error {
		_, err := d.Fabric.Umount(context.WithoutCancel(ctx), fabric.UmountRequest{Dir: view})
		return err
	})
	var listed int
	ls, err := Timed(float64(n), func() error { listed, err = lsF(ctx, view); return err })
	if err != nil {
		return err
	}
	if listed < n {
		return fmt.Errorf("ls -f of the projection listed %d entries, want %d", listed, n)
	}
	lsNative, err := Timed(float64(n), func() error { _, err := lsF(ctx, src); return err })
	if err != nil {
		return err
	}
	exp, err := Timed(float64(n), func() error { return d.Ops.ExportDir(ctx, root, filepath.Join(work, "out")) })
	if err != nil {
		return err
	}
	cpOut, err := Timed(float64(n), func() error {
		return run(ctx, "cp", "-a", src, filepath.Join(work, "cp-out"))
	})
	if err != nil {
		return err
	}
	daemonPeak := peakMiB("self") - base
	proj := 0.0
	if pid := projectionPid(d.StateDir); pid > 0 {
		proj = peakMiB(strconv.Itoa(pid))
	}

	name := fmt.Sprintf("a directory of %s entries", fmtCount(n))
	secs := func(m Measurement) float64 { return m.Elapsed.Seconds() }
	e.Add(Row{Name: "import " + name, Value: secs(imp), Unit: "s", N: 1, Path: "api",
		Baseline: "cp -a + syncfs", BaselineValue: secs(cp), Note: "empty files; fresh store"})
	e.Add(Row{Name: "ls -f of " + name + " in the projection", Value: secs(ls), Unit: "s", N: 1,
		Baseline: "ls -f on ext4", BaselineValue: secs(lsNative), Note: "first listing: nothing cached"})
	e.Add(Row{Name: "export " + name, Value: secs(exp), Unit: "s", N: 1, Path: "api",
		Baseline: "cp -a", BaselineValue: secs(cpOut)})
	budget := 256.0 * float64(n) / 1e6
	e.Add(Row{Name: "esfd peak memory for " + name, Value: daemonPeak, Unit: "MiB", N: 1,
		Targets: []Target{AtMost(max(budget, 64))},
		Note:    "growth of the peak RSS of the process that runs the daemon, over import, listing and export"})
	e.Add(Row{Name: "projection peak memory for " + name, Value: proj, Unit: "MiB", N: 1,
		Targets: []Target{AtMost(max(budget, 64))},
		Note:    "peak RSS (VmHWM) of the projection server process, start included"})
	return nil
}

// createEmpty makes dir with n empty files.
func createEmpty(dir string, n int) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	for i := range n {
		fd, err := unix.Openat(dfd, fmt.Sprintf("entry-%07d", i), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}
	return nil
}

// lsF runs ls -f on dir and counts the lines.
func lsF(ctx context.Context, dir string) (int, error) {
	out, err := exec.CommandContext(ctx, "ls", "-f", dir).Output()
	if err != nil {
		return 0, fmt.Errorf("ls -f %s: %w", dir, err)
	}
	return bytes.Count(out, []byte{'\n'}), nil
}

// peakMiB is the VmHWM of /proc/<pid> in MiB.
func peakMiB(pid string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// projectionPid finds the child process serving the projection of the
// daemon whose state dir is state: the one whose command line names it.
func projectionPid(state string) int {
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmdline, []byte(state)) {
			return pid
		}
	}
	return 0
}
