package runc

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/executortest"
	"github.com/esf-dev/esf/executor/runc/runctest"
)

// TestConformance runs the executor seam's conformance suite on real
// containers: what fabric's logic tests assume of the fake, runc does.
// The leak checks are newEnv's (no container, bundle, cgroup or process
// in any rootfs of the suite is left once a subtest's containers stop).
func TestConformance(t *testing.T) {
	var cur *env // the subtest's (subtests run one at a time)
	executortest.Run(t, executortest.Harness{
		New: func(t *testing.T) executor.Executor {
			cur = newEnv(t)
			return cur.e
		},
		Rootfs: func(t *testing.T) string {
			// In the env's directory, which outlives its checks (a
			// TempDir of the subtest would be gone by then).
			cur.mu.Lock()
			dir := filepath.Join(cur.dir, fmt.Sprintf("rootfs-%d", len(cur.roots)))
			cur.mu.Unlock()
			if err := runctest.Busybox(dir); err != nil {
				t.Fatal(err)
			}
			cur.mu.Lock()
			cur.roots = append(cur.roots, dir)
			cur.mu.Unlock()
			return dir
		},
		Limits: true,
		TTY:    true,
	})
}
