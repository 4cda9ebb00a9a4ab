package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/journal"
)

var internalPrefixes atomic.Int64

func openOn(t *testing.T, c *etcdtest.Cluster, prefix string, mod func(*Options)) *Store {
	t.Helper()
	o := Options{Endpoints: c.Endpoints(), Prefix: prefix, Failpoint: func(string) error { return nil }}
	if mod != nil {
		mod(&o)
	}
	s, err := Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newPrefix() string { return fmt.Sprintf("internal/%d", internalPrefixes.Add(1)) }

// TestLostReplyResolved: a commit whose reply was lost is resolved
// exactly: one that happened is reported committed; one that did not is
// aborted for good, so its request, arriving late, cannot commit.
func TestLostReplyResolved(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1, NoFsync: true})
	s := openOn(t, c, newPrefix(), nil)
	ctx := context.Background()
	lostReply := status.Error(codes.Unavailable, "connection reset (simulated)")

	write := func(key string) *tx {
		t.Helper()
		x := newTx(s, ctx)
		if _, err := x.Get([]byte(key)); !errors.Is(err, journal.ErrNotFound) {
			t.Fatal(err)
		}
		if err := x.Put([]byte(key), []byte("v")); err != nil {
			t.Fatal(err)
		}
		if err := x.AppendEvent(journal.Event{Type: "test.w"}); err != nil {
			t.Fatal(err)
		}
		return x
	}

	// The commit happened; its reply is "lost".
	done := write("a")
	if res, err := s.commit(ctx, done); err != nil || res != committed {
		t.Fatalf("commit: %v, %v", res, err)
	}
	if res, err := s.resolve(ctx, done, lostReply); err != nil || res != committed {
		t.Fatalf("resolve of a commit that happened: %v, %v; want committed", res, err)
	}

	// The commit never reached the cluster: resolving aborts it, and
	// the request, sent afterwards, fails its compare.
	late := write("b")
	if res, err := s.resolve(ctx, late, lostReply); err != nil || res != lost {
		t.Fatalf("resolve of a commit that did not happen: %v, %v; want lost", res, err)
	}
	if res, err := s.commit(ctx, late); err != nil || res != conflicted {
		t.Fatalf("late commit after its abort: %v, %v; want conflicted", res, err)
	}
	if err := s.View(ctx, func(r journal.Reader) error {
		_, err := r.Get([]byte("b"))
		return err
	}); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("the aborted commit's key: %v, want not found", err)
	}
	if n, err := journal.LastSeq(ctx, s); err != nil || n != 1 {
		t.Fatalf("LastSeq = %d, %v; want 1 (the aborted commit's event is not in the log)", n, err)
	}
	// A cause that is not a lost reply is not resolved but reported.
	if _, err := s.resolve(ctx, write("c"), errors.New("bad request")); err == nil {
		t.Fatal("resolve of a permanent error returned no error")
	}
}

// TestWatchCompactedFollowersReread: a watch whose revision was compacted
// away wakes the followers, which re-read the durable log and miss
// nothing, and the watch goes on from now.
func TestWatchCompactedFollowersReread(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1, NoFsync: true})
	prefix := newPrefix()
	follower := openOn(t, c, prefix, func(o *Options) { o.noWatch = true })
	writer := openOn(t, c, prefix, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	from, err := follower.maintain(ctx, 0) // the revision the watch would start at
	if err != nil {
		t.Fatal(err)
	}
	ch := follower.Notify()
	for i := range 5 {
		if err := writer.Update(ctx, func(tx journal.Tx) error {
			return tx.AppendEvent(journal.Event{Type: "test.missed", Data: []byte(fmt.Sprint(i))})
		}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-ch:
		t.Fatal("woken without a watch")
	default:
	}
	now, err := follower.maintain(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := follower.maintain(ctx, now); err != nil { // compacts past from
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		follower.watchLoop(ctx, from+1)
	}()
	<-ch // hangs (test timeout) if a compacted watch does not wake followers
	var seen []uint64
	if _, err := journal.Events(ctx, follower, 0, journal.EventFilter{}, func(ev journal.Event) error {
		seen = append(seen, ev.Seq)
		return nil
	}); err != nil || len(seen) != 5 {
		t.Fatalf("after the wake-up: %v, %v; want 5 events", seen, err)
	}
	// The watch restarted from now: later commits wake followers again.
	deadline := time.Now().Add(time.Minute)
	for {
		ch = follower.Notify()
		if err := writer.Update(ctx, func(tx journal.Tx) error {
			return tx.AppendEvent(journal.Event{Type: "test.live"})
		}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
			cancel()
			<-done
			return
		case <-time.After(time.Second):
			// The new watch may not have been established when that
			// commit landed; its start woke us already then. Try again.
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted watch never woke a follower")
		}
	}
}
