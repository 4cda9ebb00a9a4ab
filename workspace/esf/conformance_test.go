package esf

import (
	"testing"

	"github.com/esf-dev/esf/workspace/workspacetest"
)

// TestConformance runs the shared workspace suite against esf: a real
// daemon, runc containers on a busybox-static image, and a 1 GiB transfer
// (256 MiB under the race detector, 64 MiB with -short).
func TestConformance(t *testing.T) {
	p := newProvider(t)
	h := workspacetest.Harness{Provider: p, LargeFile: 1 << 30}
	switch {
	case testing.Short():
		h.LargeFile = 64 << 20
	case raceEnabled:
		h.LargeFile = 256 << 20
	}
	workspacetest.Run(t, h)
}
