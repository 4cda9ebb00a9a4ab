package mounter_test

import (
	"testing"

	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/mounter"
	"github.com/esf-dev/esf/mounter/mountertest"
)

// TestRealConformance runs the mounter suite against FUSE, overlayfs and
// bind mounts: what the fake stands in for.
func TestRealConformance(t *testing.T) {
	testenv.Require(t, "root", "fuse", "overlay")
	mountertest.Run(t, func(*testing.T) mounter.Mounter { return mounter.New() })
}
