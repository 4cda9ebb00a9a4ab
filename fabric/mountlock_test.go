package fabric

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/delta"
)

// TestMountLocksArePerMountPoint: while one attempt's root is locked (as
// during its mount or unmount), another attempt activates and releases
// (mounting and unmounting its own root), and a release of the locked
// root waits for the lock.
func TestMountLocksArePerMountPoint(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	f := openGraph(t)
	g := newGroup(t, f, map[string]string{"a": "1"})
	a1, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	root1 := filepath.Join(f.attemptDir(a1.AttemptID), "root")
	if !delta.Mounted(root1) {
		t.Fatalf("%s not mounted", root1)
	}
	unlock := f.lockMount(root1)
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()

	other := make(chan error, 1)
	go func() {
		a2, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
		if err == nil {
			_, err = f.Release(ctx, ReleaseRequest{AttemptID: a2.AttemptID})
		}
		other <- err
	}()
	select {
	case err := <-other:
		if err != nil {
			t.Fatalf("another attempt while %s is locked: %v", root1, err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("another attempt's activation and release waited for the lock of %s", root1)
	}

	// A release of the locked root waits for its lock.
	var unlocked atomic.Bool
	released := make(chan error, 1)
	go func() {
		_, err := f.Release(ctx, ReleaseRequest{AttemptID: a1.AttemptID})
		if err == nil && !unlocked.Load() {
			t.Errorf("release of %s finished while its mount lock was held", root1)
		}
		released <- err
	}()
	waitFor(t, "the release to wait for the mount lock", func() bool {
		f.mountLocksMu.Lock()
		defer f.mountLocksMu.Unlock()
		l := f.mountLocks[root1]
		return l != nil && l.refs == 2
	})
	unlocked.Store(true)
	locked = false
	unlock()
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if delta.Mounted(root1) {
		t.Errorf("%s still mounted after release", root1)
	}
}
