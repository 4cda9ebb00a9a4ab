package fabric

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
)

// runcColdAndPooled runs test with runc attempts started cold, then
// adopted from a warm pool of the executor: the boundary holds either way.
func runcColdAndPooled(t *testing.T, test func(t *testing.T, pool int)) {
	t.Run("cold", func(t *testing.T) { test(t, 0) })
	t.Run("pooled", func(t *testing.T) { test(t, 1) })
}

// withRuncPool gives the fabric's runc executor a pool of size n (none
// for 0).
func withRuncPool(t *testing.T, n int) func(*Options) {
	return func(o *Options) {
		if n == 0 {
			return
		}
		// openRuncWith's cleanup closes it.
		o.Executor.(*runc.Executor).SetPoolSize(n)
	}
}

// runcID is the runc id of an attempt's container.
func runcID(f *Fabric, attempt string) string { return f.exec.(*runc.Executor).RuncID(attempt) }

// waitPool waits until the runc executor's pool holds idle containers.
func waitPool(t *testing.T, ex *runc.Executor, idle int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for ex.PoolIdle() != idle {
		if time.Now().After(deadline) {
			t.Fatalf("pool: %d idle, want %d", ex.PoolIdle(), idle)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// activateRunc activates; with a pool, once the pool is ready, and the
// activation must adopt one of its containers.
func activateRunc(t *testing.T, f *Fabric, req ActivateRequest) (AttemptView, error) {
	t.Helper()
	ex := f.exec.(*runc.Executor)
	pooled := ex.PoolIdle() > 0 || ex.PoolAdopted() > 0
	if pooled {
		waitPool(t, ex, 1)
	}
	before := ex.PoolAdopted()
	a, err := f.Activate(context.Background(), req)
	if err == nil && pooled && ex.PoolAdopted() != before+1 {
		t.Fatalf("activation %s did not adopt a pool container", a.AttemptID)
	}
	return a, err
}

// TestPooledRuncCountedByQuota: with --max-attempts 2 and a pool of 2, the
// idle containers only fill the room live attempts leave (live + idle ≤
// 2), activations adopt them, and the room comes back when attempts end.
func TestPooledRuncCountedByQuota(t *testing.T) {
	f, g := openRuncWith(t, func(o *Options) { o.MaxLiveAttempts = 2; withRuncPool(t, 2)(o) })
	ex := f.exec.(*runc.Executor)
	ctx := context.Background()
	waitPool(t, ex, 2)
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if ex.PoolAdopted() != 1 {
		t.Fatalf("first activation: %d adopted", ex.PoolAdopted())
	}
	waitPool(t, ex, 1)
	if out, _, code := run(t, f, a.AttemptID, "sh", "-c", "echo in > /in; cat /in"); out != "in\n" || code != 0 {
		t.Fatalf("exec in the adopted container: %q %d", out, code)
	}
	b, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc})
	if err != nil {
		t.Fatal(err)
	}
	if ex.PoolAdopted() != 2 {
		t.Fatalf("second activation: %d adopted", ex.PoolAdopted())
	}
	// Full: no idle container may wait beside two live attempts.
	waitPool(t, ex, 0)
	if out, _, code := run(t, f, b.AttemptID, "sh", "-c", "test -e /in && echo leaked || echo own"); out != "own\n" || code != 0 {
		t.Fatalf("the second attempt sees the first's file: %q %d", out, code)
	}
	if _, err := f.Release(ctx, ReleaseRequest{AttemptID: a.AttemptID}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, ex, 1)
}

// TestPooledRuncFailedActivationGivesRoomBack: with --max-attempts 1 and a
// pool of 1, an activation the pool's container cannot serve (the tree's
// /proc is a symlink, refused before anything is made) fails, and gives
// back both the quota's room and the idle container: the next activation
// adopts it at once, neither queued nor cold.
func TestPooledRuncFailedActivationGivesRoomBack(t *testing.T) {
	f, g := openRuncWith(t, func(o *Options) { o.MaxLiveAttempts = 1; withRuncPool(t, 1)(o) })
	ex := f.exec.(*runc.Executor)
	ctx := context.Background()
	bad := t.TempDir()
	if err := runctest.Busybox(bad); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(bad, "proc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/tmp", filepath.Join(bad, "proc")); err != nil {
		t.Fatal(err)
	}
	imp, err := f.Import(ctx, ImportSource{Path: bad})
	if err != nil {
		t.Fatal(err)
	}
	bg, err := f.CreateGroup(ctx, CreateGroupRequest{RootID: imp.Root.String(), Source: "bad"})
	if err != nil {
		t.Fatal(err)
	}
	waitPool(t, ex, 1)
	if _, err := f.Activate(ctx, ActivateRequest{NodeID: bg.Node.NodeID, Executor: ExecutorRunc, NoQueue: true}); err == nil {
		t.Fatal("activation on a tree whose /proc is a symlink succeeded")
	}
	waitPool(t, ex, 1)
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID, Executor: ExecutorRunc, NoQueue: true})
	if err != nil {
		t.Fatalf("activation after a failed one: %v", err)
	}
	if ex.PoolAdopted() != 1 {
		t.Fatalf("%d adopted, want the idle container", ex.PoolAdopted())
	}
	if out, _, code := run(t, f, a.AttemptID, "sh", "-c", "echo ok"); out != "ok\n" || code != 0 {
		t.Fatalf("exec: %q %d", out, code)
	}
	// Full again: no idle container beside the live attempt.
	waitPool(t, ex, 0)
}
