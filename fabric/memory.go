package fabric

import (
	"runtime/debug"

	"github.com/esf-dev/esf/ingest"
)

// largeTree is the number of entries past which an import or a seal hands
// its transient memory back to the OS when it ends.
const largeTree = 100_000

// freeOSMemory is debug.FreeOSMemory; tests count the calls.
var freeOSMemory = debug.FreeOSMemory

// returnMemory gives back what a large import or seal used. Its builder
// and buffers are garbage once it returns (about 1 KiB per entry: a
// million-entry directory took esfd to 1.2 GiB, issue 15 finding 9), but
// an idle daemon allocates nothing, so no collection runs and the pages
// stay resident for good. One forced collection of a heap that is now
// mostly garbage is cheap next to the import itself.
func (f *Fabric) returnMemory(s ingest.Stats) {
	if s.Files+s.Dirs+s.Symlinks+s.Others < largeTree {
		return
	}
	freeOSMemory()
}
