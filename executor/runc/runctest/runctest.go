package runctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/esf-dev/esf/internal/testenv"
)

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = testenv.BusyboxPath

// Needs names the testenv capabilities real containers need: root, runc,
// a static busybox (scripts/deps.sh installs both packages) and the go
// tool to build executor/init. Tests call testenv.Require(t, Needs...).
var Needs = []string{"root", "runc", "busybox", "cmd:go"}

// Check says why real containers cannot run here, or nil (a
// *testenv.MissingError: for a TestMain or a benchmark row, where there
// is no test to skip or fail).
func Check() error { return testenv.Check(Needs...) }

// BuildInit builds executor/init, static, into dir and returns its path.
func BuildInit(dir string) (string, error) {
	out := filepath.Join(dir, "esf-init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "github.com/esf-dev/esf/executor/init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build init: %v: %s", err, b)
	}
	return out, nil
}

// Busybox makes dir a minimal rootfs: /bin/busybox, a symlink per applet
// in /bin, and an empty /tmp. No /proc, /dev, /sys, /etc: the runtime must
// cope with an image that has nothing.
func Busybox(dir string) error {
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	b, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bin, "busybox"), b, 0o755); err != nil {
		return err
	}
	list, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(bin, applet)); err != nil {
			return err
		}
	}
	return nil
}

// RemoveCgroupParents removes the empty parent cgroups runc left for a
// namespace (/<ns> in every hierarchy, v1 and v2): runc deletes a
// container's cgroup, never its parent. A parent still holding a
// container's cgroup is kept (rmdir of a non-empty cgroup fails).
func RemoveCgroupParents(ns string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", ns))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", ns))
	for _, d := range dirs {
		os.Remove(d)
	}
}
