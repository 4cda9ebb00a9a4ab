package etcd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/etcd"
)

// Tests of what journaltest cannot see: several stores (workers) on one
// prefix, etcd's limits, transactions its writer never finished, and the
// cluster losing its leader.

// shared opens n stores on one new prefix of c.
func shared(t *testing.T, c *etcdtest.Cluster, n int, mod func(*etcd.Options)) []*etcd.Store {
	t.Helper()
	prefix := fmt.Sprintf("shared/%d", prefixes.Add(1))
	var out []*etcd.Store
	for range n {
		o := etcd.Options{Endpoints: c.Endpoints(), Prefix: prefix, Failpoint: func(string) error { return nil }}
		if mod != nil {
			mod(&o)
		}
		s, err := etcd.Open(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out = append(out, s)
	}
	return out
}

func mustUpdate(t *testing.T, s journal.Store, fn func(tx journal.Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func putKeys(t *testing.T, s journal.Store, kvs ...string) {
	t.Helper()
	mustUpdate(t, s, func(tx journal.Tx) error {
		for i := 0; i < len(kvs); i += 2 {
			if err := tx.Put([]byte(kvs[i]), []byte(kvs[i+1])); err != nil {
				return err
			}
		}
		return nil
	})
}

func scanKeys(t *testing.T, s journal.Store, prefix string) []string {
	t.Helper()
	var out []string
	if err := s.View(context.Background(), func(r journal.Reader) error {
		return journal.ScanPrefix(r, []byte(prefix), func(k, v []byte) error {
			out = append(out, string(k)+"="+string(v))
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGuardsSeeOtherWorkers commits, between an Update's reads and its
// commit, a change of another store to what it read, and checks that the
// Update runs again and sees it: a key changed, a key deleted, a key
// created in a scanned range, a key deleted from a scanned range, and
// the tombstones cleared under a scan.
func TestGuardsSeeOtherWorkers(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1, NoFsync: true})
	tests := []struct {
		name    string
		read    func(r journal.Reader) (string, error) // what fn derives its write from
		changes bool                                   // the second run reads another value
		meddle  func(t *testing.T, other *etcd.Store)
	}{
		{"get of a changed key", getA, true, func(t *testing.T, o *etcd.Store) { putKeys(t, o, "a", "changed") }},
		{"get of a deleted key", getA, true, func(t *testing.T, o *etcd.Store) {
			mustUpdate(t, o, func(tx journal.Tx) error { return tx.Delete([]byte("a")) })
		}},
		{"get of a key created", getZ, true, func(t *testing.T, o *etcd.Store) { putKeys(t, o, "z", "new") }},
		{"scan, a key inserted", scanR, true, func(t *testing.T, o *etcd.Store) { putKeys(t, o, "r/2", "x") }},
		{"scan, a key deleted", scanR, true, func(t *testing.T, o *etcd.Store) {
			mustUpdate(t, o, func(tx journal.Tx) error { return tx.Delete([]byte("r/1")) })
		}},
		{"scan, a key changed", scanR, true, func(t *testing.T, o *etcd.Store) { putKeys(t, o, "r/3", "y") }},
		{"scan, inserted and deleted again", scanR, false, func(t *testing.T, o *etcd.Store) {
			putKeys(t, o, "r/2", "x")
			mustUpdate(t, o, func(tx journal.Tx) error { return tx.Delete([]byte("r/2")) })
		}},
		{"scan, tombstones cleared", scanR, false, func(t *testing.T, o *etcd.Store) {
			if _, err := o.Maintain(context.Background(), 0); err != nil {
				t.Fatal(err)
			}
		}},
		{"events read, one appended", lastSeq, true, func(t *testing.T, o *etcd.Store) {
			mustUpdate(t, o, func(tx journal.Tx) error { return tx.AppendEvent(journal.Event{Type: "test.other"}) })
		}},
		{"events read, the indexer moved them", lastSeq, false, func(t *testing.T, o *etcd.Store) {
			if err := o.FlushEvents(context.Background()); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// No background indexing: the test moves events itself.
			ss := shared(t, c, 2, func(o *etcd.Options) { o.IndexDelay = time.Hour })
			s, other := ss[0], ss[1]
			putKeys(t, s, "a", "1", "r/1", "1", "r/3", "3", "old", "x")
			mustUpdate(t, s, func(tx journal.Tx) error {
				if err := tx.Delete([]byte("old")); err != nil { // a tombstone to clear
					return err
				}
				return tx.AppendEvent(journal.Event{Type: "test.first"})
			})
			var runs []string
			mustUpdate(t, s, func(tx journal.Tx) error {
				seen, err := tc.read(tx)
				if err != nil {
					return err
				}
				runs = append(runs, seen)
				if len(runs) == 1 {
					tc.meddle(t, other)
				}
				return tx.Put([]byte("derived"), []byte(seen))
			})
			if len(runs) != 2 || tc.changes == (runs[0] == runs[1]) {
				t.Fatalf("fn ran %d times, seeing %q: want a second run after the other store's commit (changed: %v)", len(runs), runs, tc.changes)
			}
			var got string
			if err := s.View(context.Background(), func(r journal.Reader) error {
				v, err := r.Get([]byte("derived"))
				got = string(v)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if got != runs[len(runs)-1] {
				t.Errorf("committed %q, want what the last run saw: %q", got, runs[len(runs)-1])
			}
		})
	}
}

func getA(r journal.Reader) (string, error) {
	v, err := r.Get([]byte("a"))
	if errors.Is(err, journal.ErrNotFound) {
		return "<none>", nil
	}
	return string(v), err
}

func getZ(r journal.Reader) (string, error) {
	v, err := r.Get([]byte("z"))
	if errors.Is(err, journal.ErrNotFound) {
		return "<none>", nil
	}
	return string(v), err
}

func scanR(r journal.Reader) (string, error) {
	var parts []string
	err := journal.ScanPrefix(r, []byte("r/"), func(k, v []byte) error {
		parts = append(parts, string(k)+"="+string(v))
		return nil
	})
	return strings.Join(parts, ","), err
}

func lastSeq(r journal.Reader) (string, error) {
	n, err := r.LastSeq()
	return fmt.Sprint(n), err
}

// TestWorkersSerialise runs increments and appends from three stores on
// one prefix: no increment is lost, the log is gapless, and its order is
// the commit order (each event carries the counter value its transaction
// wrote, so the log must list them 1, 2, 3, ...).
func TestWorkersSerialise(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	ss := shared(t, c, 4, nil)
	writers, follower := ss[:3], ss[3]
	const each, perStore = 25, 4
	total := uint64(len(writers) * perStore * each)

	// A follower on a fourth store sees every event once, in order, live.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	followed := make(chan error, 1)
	go func() {
		next := uint64(1)
		err := journal.Follow(ctx, follower, 0, journal.EventFilter{}, func(ev journal.Event) error {
			if ev.Seq != next {
				return fmt.Errorf("follower: seq %d, want %d", ev.Seq, next)
			}
			if err := inOrder(ev); err != nil {
				return err
			}
			if next++; next > total {
				cancel() // all seen
			}
			return nil
		})
		if next > total && errors.Is(err, context.Canceled) {
			err = nil
		}
		followed <- err
	}()

	var wg sync.WaitGroup
	for i, s := range writers {
		for range perStore {
			wg.Go(func() {
				for range each {
					err := s.Update(context.Background(), func(tx journal.Tx) error {
						n, err := journal.Increment(tx, "n")
						if err != nil {
							return err
						}
						return tx.AppendEvent(journal.Event{Type: "test.inc", Data: json.RawMessage(fmt.Sprintf(`{"n":%d,"w":%d}`, n, i))})
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	select {
	case err := <-followed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		n, err := journal.LastSeq(context.Background(), follower)
		t.Fatalf("the follower did not see every event within a minute (last seq %d, %v)", n, err)
	}
	for i, s := range ss {
		n := uint64(0)
		if _, err := journal.Events(context.Background(), s, 0, journal.EventFilter{}, func(ev journal.Event) error {
			n++
			if ev.Seq != n {
				return fmt.Errorf("seq %d at position %d", ev.Seq, n)
			}
			return inOrder(ev)
		}); err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
		if n != total {
			t.Errorf("store %d reads %d events, want %d", i, n, total)
		}
	}
}

// inOrder checks that an event of TestWorkersSerialise sits where its
// transaction's commit put it: the counter it wrote is its Seq.
func inOrder(ev journal.Event) error {
	var d struct{ N uint64 }
	if err := json.Unmarshal(ev.Data, &d); err != nil {
		return err
	}
	if d.N != ev.Seq {
		return fmt.Errorf("event %d carries counter %d: the log is not in commit order", ev.Seq, d.N)
	}
	return nil
}

// TestLargeTransaction commits, in one Update, far more than one etcd
// request holds (a fork of 10,000 children: records, index keys, events,
// and a recorded result over 1 MiB), while readers on another store check
// that they see all of it or none.
func TestLargeTransaction(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	ss := shared(t, c, 2, nil)
	const n = 10_000
	pad := strings.Repeat("p", 200)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var views atomic.Int64
	readerDone := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			// The first and last key and the log: a reader that saw part
			// of the commit sees some of them and not the others.
			var first, last bool
			var events uint64
			err := ss[1].View(ctx, func(r journal.Reader) error {
				_, err1 := r.Get([]byte("kid/00000"))
				_, err2 := r.Get([]byte(fmt.Sprintf("kid/%05d", n-1)))
				first, last = err1 == nil, err2 == nil
				var err error
				events, err = r.LastSeq()
				return errors.Join(err, ignoreNotFound(err1), ignoreNotFound(err2))
			})
			if ctx.Err() != nil {
				break
			}
			if err != nil {
				readerDone <- err
				return
			}
			if first != last || first != (events == n) || !first && events != 0 {
				readerDone <- fmt.Errorf("a reader saw part of the commit: first key %v, last key %v, %d events", first, last, events)
				return
			}
			views.Add(1)
		}
		readerDone <- nil
	}()
	result := map[string]string{"pad": strings.Repeat("r", 3<<20/2)} // 1.5 MiB
	res, replayed, err := journal.DoIdempotent(context.Background(), ss[0], "big", "fork", "req", func(tx journal.Tx) (any, error) {
		for i := range n {
			if err := tx.Put([]byte(fmt.Sprintf("kid/%05d", i)), []byte(pad)); err != nil {
				return nil, err
			}
			if err := tx.AppendEvent(journal.Event{Type: "test.kid", Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}); err != nil {
				return nil, err
			}
		}
		return result, nil
	})
	if err != nil || replayed {
		t.Fatalf("large update: replayed %v, %v", replayed, err)
	}
	cancel()
	if err := <-readerDone; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d consistent views during the commit", views.Load())
	if got := len(scanKeys(t, ss[1], "kid/")); got != n {
		t.Fatalf("%d keys after the commit, want %d", got, n)
	}
	again, replayed, err := journal.DoIdempotent(context.Background(), ss[1], "big", "fork", "req", func(tx journal.Tx) (any, error) {
		return nil, errors.New("ran again")
	})
	if err != nil || !replayed || string(again) != string(res) {
		t.Fatalf("replay on another store: %v, replayed %v, %d bytes (want %d)", err, replayed, len(again), len(res))
	}
	i := 0
	if _, err := journal.Events(context.Background(), ss[1], 0, journal.EventFilter{}, func(ev journal.Event) error {
		if want := fmt.Sprintf(`{"i":%d}`, i); string(ev.Data) != want || ev.Seq != uint64(i+1) {
			return fmt.Errorf("event %d: seq %d data %s", i, ev.Seq, ev.Data)
		}
		i++
		return nil
	}); err != nil || i != n {
		t.Fatalf("events: %d, %v", i, err)
	}
}

// TestRollForwardByReader publishes a large transaction whose writer stops
// right after the commit point (the roll-forward failpoint): the Update
// has committed, and the next reader, on another store, finishes it.
func TestRollForwardByReader(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1, NoFsync: true})
	ss := shared(t, c, 2, func(o *etcd.Options) { o.RollForwardStall = 50 * time.Millisecond })
	writer, reader := ss[0], ss[1]
	w, err := etcd.Open(context.Background(), etcd.Options{Endpoints: c.Endpoints(), Prefix: writer.Prefix(),
		Failpoint: func(name string) error {
			if name == etcd.FailpointRollForward {
				return errors.New("writer stops here")
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const n = 1000
	mustUpdate(t, w, func(tx journal.Tx) error {
		for i := range n {
			if err := tx.Put([]byte(fmt.Sprintf("k/%04d", i)), []byte("v")); err != nil {
				return err
			}
		}
		return tx.AppendEvent(journal.Event{Type: "test.big"})
	})
	if left := countKeys(t, c, writer.Prefix()+"/x/commit/"); left != 1 {
		t.Fatalf("%d commit keys after the writer stopped, want 1 (the test did not stop it)", left)
	}
	if got := len(scanKeys(t, reader, "k/")); got != n {
		t.Fatalf("reader sees %d keys, want %d", got, n)
	}
	if left := countKeys(t, c, writer.Prefix()+"/x/"); left != 0 {
		// Only the outcome marker and pending events may remain.
		if rest := countKeys(t, c, writer.Prefix()+"/x/stage/") + countKeys(t, c, writer.Prefix()+"/x/commit/"); rest != 0 {
			t.Fatalf("%d staged or commit keys left after the reader rolled forward", rest)
		}
	}
	if seq, err := journal.LastSeq(context.Background(), reader); err != nil || seq != 1 {
		t.Fatalf("LastSeq %d, %v", seq, err)
	}
}

// TestStagedGarbageCleared: staged writes of a writer that died before
// publishing are deleted by the maintenance once they are a round old.
func TestStagedGarbageCleared(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1, NoFsync: true})
	s := shared(t, c, 1, nil)[0]
	cli := c.Client(t)
	dead := "/" + s.Prefix() + "/x/stage/deadwriter/000000"
	if _, err := cli.Put(context.Background(), dead, "p..."); err != nil {
		t.Fatal(err)
	}
	rev, err := s.Maintain(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if countKeys(t, c, s.Prefix()+"/x/stage/") != 1 {
		t.Fatal("staged writes younger than a round were deleted")
	}
	if _, err := s.Maintain(context.Background(), rev); err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, c, s.Prefix()+"/x/stage/"); n != 0 {
		t.Fatalf("%d staged keys of a dead writer left after two rounds", n)
	}
	// The round compacted the history up to rev.
	if _, err := cli.Get(context.Background(), dead, clientv3.WithRev(rev-1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Errorf("read below the compacted revision: %v, want ErrCompacted", err)
	}
}

func countKeys(t *testing.T, c *etcdtest.Cluster, prefix string) int64 {
	t.Helper()
	resp, err := c.Client(t).Get(context.Background(), "/"+prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// TestLeaderKilledUnderLoad SIGKILLs the leader of a 3-member cluster while
// two stores commit idempotent operations, then restarts it: no
// acknowledged operation is lost, none is half there, and the log holds
// exactly one event per operation that committed, gapless.
func TestLeaderKilledUnderLoad(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	ss := shared(t, c, 2, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var acked sync.Map
	var nAcked, nFailed atomic.Int64
	op := func(s journal.Store, key string) error {
		_, _, err := journal.DoIdempotent(ctx, s, key, "op", key, func(tx journal.Tx) (any, error) {
			if err := tx.Put([]byte("rec/"+key), []byte(key)); err != nil {
				return nil, err
			}
			if err := tx.AppendEvent(journal.Event{Type: "test.op", IdempotencyKey: key}); err != nil {
				return nil, err
			}
			return map[string]string{"key": key}, nil
		})
		return err
	}
	var wg sync.WaitGroup
	for w := range 8 {
		s := ss[w%2]
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				err := op(s, key)
				switch {
				case err == nil:
					acked.Store(key, true)
					nAcked.Add(1)
				case ctx.Err() != nil:
				case errors.Is(err, journal.ErrUnavailable):
					nFailed.Add(1) // outcome unknown to the caller: checked below
				default:
					t.Errorf("op %s: %v", key, err)
				}
			}
		})
	}
	waitAcked := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for nAcked.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d operations acknowledged, want %d", nAcked.Load(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitAcked(100)
	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	before := nAcked.Load()
	c.Members[leader].Kill()
	t.Logf("killed the leader %s after %d acknowledged operations", c.Members[leader].Name, before)
	waitAcked(before + 200) // the survivors elect a leader; the stores go on
	if err := c.Members[leader].Restart(); err != nil {
		t.Fatal(err)
	}
	waitAcked(nAcked.Load() + 100)
	cancel()
	wg.Wait()
	t.Logf("%d acknowledged, %d failed as unavailable", nAcked.Load(), nFailed.Load())

	// Audit through a fresh store.
	audit, err := etcd.Open(context.Background(), etcd.Options{Endpoints: c.Endpoints(), Prefix: ss[0].Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer audit.Close()
	recs := map[string]bool{}
	events := map[string]int{}
	if err := audit.View(context.Background(), func(r journal.Reader) error {
		if err := journal.ScanPrefix(r, []byte("rec/"), func(k, _ []byte) error {
			key := strings.TrimPrefix(string(k), "rec/")
			recs[key] = true
			if _, found, err := journal.CheckIdempotency(r, key, "op", key); err != nil || !found {
				return fmt.Errorf("record %s without its idempotency entry (%v)", key, err)
			}
			return nil
		}); err != nil {
			return err
		}
		var seq uint64
		return r.Events(0, func(ev journal.Event) error {
			if seq++; ev.Seq != seq {
				return fmt.Errorf("event seq %d at position %d", ev.Seq, seq)
			}
			events[ev.IdempotencyKey]++
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	acked.Range(func(k, _ any) bool {
		if !recs[k.(string)] {
			t.Errorf("acknowledged operation %s lost", k)
		}
		return true
	})
	for key := range recs {
		if events[key] != 1 {
			t.Errorf("operation %s has %d events, want 1", key, events[key])
		}
	}
	if len(events) != len(recs) {
		t.Errorf("%d operations with events, %d with records", len(events), len(recs))
	}
}

func ignoreNotFound(err error) error {
	if errors.Is(err, journal.ErrNotFound) {
		return nil
	}
	return err
}
