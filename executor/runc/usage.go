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

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/esf-dev/esf/executor"
)

// Usage reads container id's CPU time and memory from its cgroup, v1
// (cpuacct, memory hierarchies) or v2 (unified).
func (e *Executor) Usage(ctx context.Context, id string) (executor.Usage, error) {
	var cs specs.Spec
	if err := readJSON(filepath.Join(e.bundle(id), "config.json"), &cs); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return executor.Usage{}, fmt.Errorf("usage: container %s: %w", id, executor.ErrNotFound)
		}
		return executor.Usage{}, fmt.Errorf("usage %s: %w", id, err)
	}
	if cs.Linux == nil || !strings.HasPrefix(cs.Linux.CgroupsPath, "/") {
		return executor.Usage{}, fmt.Errorf("usage %s: no cgroup path: %w", id, executor.ErrNotFound)
	}
	cg := cs.Linux.CgroupsPath
	var u executor.Usage
	if v, err := readUint(filepath.Join("/sys/fs/cgroup/cpuacct", cg, "cpuacct.usage")); err == nil {
		// cgroup v1
		u.CPUNanos = v
		if m, err := readUint(filepath.Join("/sys/fs/cgroup/memory", cg, "memory.usage_in_bytes")); err == nil {
			u.MemoryBytes = int64(m)
		}
		if l, err := readUint(filepath.Join("/sys/fs/cgroup/memory", cg, "memory.limit_in_bytes")); err == nil && l < 1<<62 {
			u.MemoryLimit = int64(l)
		}
		return u, nil
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", cg, "cpu.stat"))
	if err != nil {
		return u, fmt.Errorf("usage %s: %w", id, executor.ErrNotFound)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			u.CPUNanos = n * 1000
		}
	}
	if m, err := readUint(filepath.Join("/sys/fs/cgroup", cg, "memory.current")); err == nil {
		u.MemoryBytes = int64(m)
	}
	if l, err := readUint(filepath.Join("/sys/fs/cgroup", cg, "memory.max")); err == nil {
		u.MemoryLimit = int64(l)
	}
	return u, nil
}

func readUint(name string) (uint64, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

var _ executor.UsageReporter = (*Executor)(nil)
