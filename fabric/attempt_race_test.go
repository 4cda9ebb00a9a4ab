package fabric

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/journal"
)

// TestReplayRacingFailedActivation: a same-key replay of an activation
// that arrives while the attempt is being failed (unmounted, failure not
// yet committed) neither mounts the ending attempt again nor errs: it
// returns the attempt as it is once the failure is done, and the delta is
// deleted with nothing mounted over it. The root is a custom mountpoint,
// outside the attempt's directory, where the reaper's own mount check
// cannot see a mount.
func TestReplayRacingFailedActivation(t *testing.T) {
	root := t.TempDir() // before the fabric: removed after its teardown
	f := openLogic(t)
	t.Cleanup(func() {
		if f.mounter.Mounted(root) {
			f.mounter.Unmount(root)
		}
	})
	g := newGroup(t, f, map[string]string{"a": "1"})
	key := withKey("activate-then-fail")
	req := ActivateRequest{NodeID: g.Node.NodeID, Root: root}
	first, err := f.Activate(key, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "w"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	type result struct {
		v   AttemptView
		err error
	}
	replayed := make(chan result, 1)
	hooked := false
	testHookFailUnmounted = func(id string) {
		if id != first.AttemptID || hooked {
			return
		}
		hooked = true
		go func() {
			v, err := f.Activate(key, req)
			replayed <- result{v, err}
		}()
		// Give the replay the window between the unmount and the commit:
		// it must wait for the failure rather than act in it.
		select {
		case r := <-replayed:
			replayed <- r
		case <-time.After(300 * time.Millisecond):
		}
	}
	t.Cleanup(func() { testHookFailUnmounted = nil })
	f.failAttempt(context.Background(), first.AttemptID, errors.New("container start failed"))
	if !hooked {
		t.Fatal("failAttempt did not reach its unmounted point")
	}
	r := <-replayed
	if r.err != nil || r.v.AttemptID != first.AttemptID {
		t.Fatalf("replay: %s, %v; want %s without error", r.v.AttemptID, r.err, first.AttemptID)
	}
	if r.v.State != journal.AttemptFailed {
		t.Errorf("replay returned state %s; want the attempt as it is now, failed", r.v.State)
	}
	if f.mounter.Mounted(root) {
		t.Errorf("the failed attempt's root %s is mounted again", root)
	}
	f.reaping.Wait()
	if _, err := os.Stat(f.attemptDir(first.AttemptID)); !os.IsNotExist(err) {
		t.Errorf("failed attempt's delta left: %v", err)
	}
	v, err := f.attemptView(context.Background(), first.AttemptID)
	if err != nil || v.State != journal.AttemptFailed {
		t.Fatalf("attempt after the race: %s, %v; want failed", v.State, err)
	}
}

// TestReaperKeepsDeltaUnderCustomMount: the reaper does not delete the
// delta of an attempt whose overlay is mounted at a custom root, which a
// check of the default mountpoint alone would miss.
func TestReaperKeepsDeltaUnderCustomMount(t *testing.T) {
	requireMounts(t)
	root := t.TempDir()
	f := openGraph(t)
	g := newGroup(t, f, map[string]string{"a": "1"})
	a, err := f.Activate(context.Background(), ActivateRequest{NodeID: g.Node.NodeID, Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "w"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.removeAttemptDir(a.AttemptID)
	upper := delta.Layout{Dir: filepath.Join(f.attemptDir(a.AttemptID), "delta")}.Upper()
	if b, err := os.ReadFile(filepath.Join(upper, "w")); err != nil || string(b) != "kept" {
		t.Fatalf("the live root's upper file after a reap: %q, %v", b, err)
	}
	if !f.mounter.UpperInUse(filepath.Join(f.attemptDir(a.AttemptID), "delta")) {
		t.Error("UpperInUse: live custom mount not seen")
	}
	if _, err := f.Release(context.Background(), ReleaseRequest{AttemptID: a.AttemptID}); err != nil {
		t.Fatal(err)
	}
	f.reaping.Wait()
	if _, err := os.Stat(f.attemptDir(a.AttemptID)); !os.IsNotExist(err) {
		t.Errorf("released attempt's delta left: %v", err)
	}
}
