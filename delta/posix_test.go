package delta

import (
	"sort"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
)

// notApplicable lists posixtest cases that test a property overlayfs
// itself does not have, with the reason; every other case must pass on an
// attempt root (overlayfs on the FUSE projection).
var notApplicable = map[string]string{
	"FcntlFlockLocksFile": "POSIX record locks belong to the process, so two fds of one process never " +
		"conflict: ext4 fails this case too; it expects a FUSE server's per-fd lock owners",
}

// TestPosixOnAttemptRoot runs go-fuse's POSIX conformance cases against an
// attempt's writable root: overlayfs with the projection as its lower layer.
func TestPosixOnAttemptRoot(t *testing.T) {
	_, _, lower := projected(t, nil)
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			if why, ok := notApplicable[name]; ok {
				t.Skip(why)
			}
			l := attempt(t, lower)
			posixtest.All[name](t, l.Root)
		})
	}
}
