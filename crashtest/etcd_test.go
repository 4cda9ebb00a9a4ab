package crashtest

import (
	"fmt"
	"testing"
	"time"
)

// TestFR03_MutationsAreAtomicUnderCrashOnEtcd runs the crash matrix with
// esfd's journal on etcd: SIGKILL at every failpoint of each operation
// below, an audit of the journal as the crash left it, a restart, replays.
//
// A subset of the operations, to keep CI time in check (the full pebble
// matrix takes about two minutes): every operation reaches the journal
// through the same Store calls whatever the store, and journaltest holds
// the etcd store to the same contract, so what etcd can add is in the
// store's own paths: an Update's commit and its lost-reply handling, the
// event log a dead writer leaves pending, a large transaction published
// but not rolled forward, and recovery reading attempts from etcd. The
// subset covers each: group creation and a fork (one commit each, events),
// a fork of 60 children (staged: it also crashes between publishing and
// rolling forward), activation and release (several Updates, a lease,
// the mount recovered), and a seal (its full sequence of Updates).
func TestFR03_MutationsAreAtomicUnderCrashOnEtcd(t *testing.T) {
	requireRoot(t)
	requireEtcd(t)
	t.Parallel() // its cases share the -parallel slots with the other FR-03 tests'
	mode := etcdMode()
	start := time.Now()
	var m matrix
	t.Cleanup(func() {
		m.log(t, fmt.Sprintf("FR-03 matrix on etcd (%v; template %v; time in all cases so far: %v)", time.Since(start).Round(time.Second), buildTime(mode).Round(time.Millisecond), timing))
	})
	template(t, mode)
	for _, spec := range etcdSpecs() {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel()
			runSpec(t, mode, spec, &m)
		})
	}
}

func etcdSpecs() []*opSpec {
	// 60 children: 60 records, 120 index keys and 60 events, far beyond
	// etcd's 128 operations per request.
	staged := forkSpecN("fork-60", 60)
	staged.staged = true
	return []*opSpec{createGroupSpec(), forkSpec(), staged, activateSpec(), releaseSpec(), suspendSpec("suspend-child", false, false)}
}
