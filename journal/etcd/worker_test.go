package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/etcd"
	"github.com/esf-dev/esf/journal/journaltest"
)

// TestWorkerFencing: a registered store commits while its lease lives; once
// the lease is gone (revoked here, as its expiry would), every commit is
// refused with ErrFenced, by the cluster's compare, and Lost is closed. A
// second store of the same id registers only after the first one's key is
// gone, and the survivor lists it.
func TestWorkerFencing(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{NoFsync: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	noFP := journaltest.Options{}
	a := newStore(t, c, noFP)
	t.Cleanup(func() { a.Close() })
	b, err := etcd.Open(ctx, etcd.Options{Endpoints: c.Endpoints(), Prefix: a.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })

	ra, err := a.Register(ctx, etcd.Worker{ID: "wa", Addr: "https://a:1", Capacity: 4}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	put := func(s *etcd.Store, k string) error {
		return s.Update(ctx, func(tx journal.Tx) error { return tx.Put([]byte(k), []byte("v")) })
	}
	if err := put(a, "k1"); err != nil {
		t.Fatalf("commit of a registered worker: %v", err)
	}
	if err := ra.SetLive(ctx, 3); err != nil {
		t.Fatal(err)
	}
	ws, err := b.Workers(ctx)
	if err != nil || len(ws) != 1 || ws[0].ID != "wa" || ws[0].Live != 3 || ws[0].Capacity != 4 || ws[0].Addr != "https://a:1" {
		t.Fatalf("workers = %+v, %v", ws, err)
	}

	// The lease ends behind the worker's back (as when it is stopped past
	// its TTL): find it through the key and revoke it.
	cli := c.Client(t)
	resp, err := cli.Get(ctx, "/"+a.Prefix()+"/w/wa")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("worker key: %v %v", resp, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	if err := put(a, "k2"); !errors.Is(err, etcd.ErrFenced) || !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Fatalf("commit after the lease ended: %v, want ErrFenced", err)
	}
	select {
	case <-ra.Lost():
	case <-ctx.Done():
		t.Fatal("Lost not closed")
	}
	if err := put(a, "k3"); !errors.Is(err, etcd.ErrFenced) {
		t.Fatalf("later commit: %v, want ErrFenced", err)
	}
	if err := b.View(ctx, func(r journal.Reader) error {
		if _, err := r.Get([]byte("k2")); !errors.Is(err, journal.ErrNotFound) {
			t.Errorf("k2 of a fenced worker: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ra.Close()

	// The id is free again: b takes it and commits.
	rb, err := b.Register(ctx, etcd.Worker{ID: "wa"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	if err := put(b, "k4"); err != nil {
		t.Fatal(err)
	}
	if err := put(a, "k5"); !errors.Is(err, etcd.ErrFenced) {
		t.Fatalf("the old registration under a re-registered id: %v, want ErrFenced", err)
	}
}

// TestWorkerRegisterWaits: an id held by a live registration is taken only
// once it is released.
func TestWorkerRegisterWaits(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{NoFsync: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := newStore(t, c, journaltest.Options{})
	t.Cleanup(func() { a.Close() })
	b, err := etcd.Open(ctx, etcd.Options{Endpoints: c.Endpoints(), Prefix: a.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ra, err := a.Register(ctx, etcd.Worker{ID: "w"}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, err = b.Register(short, etcd.Worker{ID: "w"}, 30*time.Second)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("register of a held id: %v, want it to wait", err)
	}
	got := make(chan error, 1)
	go func() {
		rb, err := b.Register(ctx, etcd.Worker{ID: "w"}, 30*time.Second)
		if err == nil {
			defer rb.Close()
		}
		got <- err
	}()
	if err := ra.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestWorkerRegisterTakesOverSameState: a registration whose record has
// the same State as the new one's (a restarted process of the same state
// dir: the old one is dead) is taken over at once, whatever the old
// lease's TTL, and the old registration is fenced: its commits are
// refused and Lost closes. A different State still waits.
func TestWorkerRegisterTakesOverSameState(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{NoFsync: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := newStore(t, c, journaltest.Options{})
	t.Cleanup(func() { a.Close() })
	open := func() *etcd.Store {
		s, err := etcd.Open(ctx, etcd.Options{Endpoints: c.Endpoints(), Prefix: a.Prefix()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	b, d := open(), open()
	put := func(s *etcd.Store, k string) error {
		return s.Update(ctx, func(tx journal.Tx) error { return tx.Put([]byte(k), []byte("v")) })
	}

	// A long lease, still renewed: only the takeover can end it in time.
	ra, err := a.Register(ctx, etcd.Worker{ID: "w", State: "s1@boot"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ra.Close() })
	if err := put(a, "k1"); err != nil {
		t.Fatal(err)
	}

	// Another state waits.
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, err = d.Register(short, etcd.Worker{ID: "w", State: "s2@boot"}, time.Hour)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("register under another state: %v, want it to wait", err)
	}

	// The same state takes over at once (well before the hour).
	rb, err := b.Register(withinMinute(ctx, t), etcd.Worker{ID: "w", State: "s1@boot"}, time.Hour)
	if err != nil {
		t.Fatalf("register under the same state: %v, want it at once", err)
	}
	t.Cleanup(func() { rb.Close() })
	if err := put(b, "k2"); err != nil {
		t.Fatalf("commit of the new registration: %v", err)
	}
	if err := put(a, "k3"); !errors.Is(err, etcd.ErrFenced) {
		t.Fatalf("commit of the registration taken over: %v, want ErrFenced", err)
	}
	select {
	case <-ra.Lost():
	case <-ctx.Done():
		t.Fatal("Lost of the registration taken over not closed")
	}
	ws, err := d.Workers(ctx)
	if err != nil || len(ws) != 1 || ws[0].State != "s1@boot" {
		t.Fatalf("workers = %+v, %v", ws, err)
	}
	// Closing the old registration leaves the new one alone.
	ra.Close()
	if err := put(b, "k4"); err != nil {
		t.Fatalf("commit after the old registration closed: %v", err)
	}
}

// withinMinute bounds a takeover, which must not wait for any lease: far less
// than the leases' hour, generous for a loaded machine.
func withinMinute(ctx context.Context, t *testing.T) context.Context {
	c, cancel := context.WithTimeout(ctx, time.Minute)
	t.Cleanup(cancel)
	return c
}
