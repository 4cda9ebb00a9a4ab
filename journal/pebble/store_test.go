package pebble_test

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/journaltest"
	jpebble "github.com/esf-dev/esf/journal/pebble"
)

func TestConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T, o journaltest.Options) journal.Store {
		s, err := jpebble.Open("db", jpebble.Options{FS: vfs.NewMem(), Now: o.Now, Failpoint: o.Failpoint})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestConformanceOnDisk runs the suite once against the real filesystem, so
// fsync, locking and directory handling are exercised, not only the vfs.
func TestConformanceOnDisk(t *testing.T) {
	journaltest.Run(t, func(t *testing.T, o journaltest.Options) journal.Store {
		s, err := jpebble.Open(t.TempDir(), jpebble.Options{Now: o.Now, Failpoint: o.Failpoint})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
