package runc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// oomKills is how many processes the kernel's OOM killer has killed in
// the cgroup at cgroupsPath (v1 memory.oom_control, v2 memory.events);
// -1 when that cannot be read (no memory controller, an old kernel).
func oomKills(cgroupsPath string) int64 {
	if !strings.HasPrefix(cgroupsPath, "/") {
		return -1
	}
	for _, name := range []string{
		filepath.Join("/sys/fs/cgroup/memory", cgroupsPath, "memory.oom_control"),
		filepath.Join("/sys/fs/cgroup", cgroupsPath, "memory.events"),
	} {
		b, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return -1
}
