package fabric

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/journal"
	journaletcd "github.com/esf-dev/esf/journal/etcd"
)

var clusterPrefixes atomic.Int64

// openWorker opens a Fabric of its own state dir on the etcd journal under
// prefix, registered as worker id.
func openWorker(t *testing.T, c *etcdtest.Cluster, prefix, id string) *Fabric {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := journaletcd.Open(ctx, journaletcd.Options{Endpoints: c.Endpoints(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := s.Register(ctx, journaletcd.Worker{ID: id, Capacity: 8}, 30*time.Second)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	// The journal is real (etcd), the mounts fake: what the cluster
	// tests prove is the shared graph's logic, not overlayfs.
	f, err := Open(ctx, logicOptions(Options{StateDir: t.TempDir(), JournalStore: s,
		Cluster: &Cluster{Store: s, Registration: reg, Interval: 50 * time.Millisecond}}))
	if err != nil {
		reg.Close()
		s.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll %s: %v", id, err)
		}
		reg.Close()
		f.Close()
	})
	return f
}

// waitFor polls cond until it holds, failing t after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClusterLostWorker: two workers on one etcd journal. When worker A's
// registration ends (its lease revoked behind its back, as its expiry
// would), A is fenced: its sandboxes are gone, every later commit of it is
// refused; B fails A's live attempt and keeps its own.
func TestClusterLostWorker(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{NoFsync: true})
	prefix := fmt.Sprintf("fab/%d", clusterPrefixes.Add(1))
	a := openWorker(t, c, prefix, "wa")
	b := openWorker(t, c, prefix, "wb")
	ctx := context.Background()

	ga := newGroup(t, a, map[string]string{"a.txt": "a"})
	gb := newGroup(t, b, map[string]string{"b.txt": "b"})
	atA, err := a.Activate(ctx, ActivateRequest{NodeID: ga.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	atB, err := b.Activate(ctx, ActivateRequest{NodeID: gb.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	if atA.Runtime == nil || atA.Runtime.Worker != "wa" || atB.Runtime.Worker != "wb" {
		t.Fatalf("owners: %+v %+v", atA.Runtime, atB.Runtime)
	}
	// Each worker sees both, with its load.
	waitFor(t, "both workers with one live attempt each", func() bool {
		ws, err := b.Workers(ctx)
		return err == nil && len(ws) == 2 && ws[0].ID == "wa" && ws[0].Live == 1 && ws[1].ID == "wb" && ws[1].Live == 1
	})

	// A's lease ends.
	cli := c.Client(t)
	resp, err := cli.Get(ctx, "/"+prefix+"/w/wa")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("worker key: %v %v", resp, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}

	waitFor(t, "A fenced and its sandbox gone", func() bool { return a.Fenced() && !a.mounter.Mounted(atA.Root) })
	waitFor(t, "B failed A's attempt", func() bool {
		v, err := b.attemptView(ctx, atA.AttemptID)
		return err == nil && v.State == journal.AttemptFailed
	})
	if _, err := a.CreateGroup(ctx, CreateGroupRequest{RootID: ga.Node.RootID}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a commit of the fenced worker: %v, want failed precondition (fenced)", err)
	}
	if _, err := a.Activate(ctx, ActivateRequest{NodeID: ga.Node.NodeID}); err == nil {
		t.Fatal("the fenced worker activated an attempt")
	}
	ws, err := b.Workers(ctx)
	if err != nil || len(ws) != 1 || ws[0].ID != "wb" {
		t.Fatalf("workers after A's loss: %+v %v", ws, err)
	}
	v, err := b.attemptView(ctx, atB.AttemptID)
	if err != nil || v.State != journal.AttemptActive || !b.mounter.Mounted(atB.Root) {
		t.Fatalf("B's own attempt: %+v %v", v, err)
	}
	// B's recovery and stop-all touch only B's attempts (A's is failed
	// already; nothing of A's is B's to release).
}
