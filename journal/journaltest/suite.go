package journaltest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/journal"
)

// Options are what the suite asks of a new store; nil fields mean the
// implementation's defaults.
type Options struct {
	Now       func() time.Time
	Failpoint func(name string) error
}

// NewStore returns an empty store configured with o. The suite closes it.
type NewStore func(t *testing.T, o Options) journal.Store

// Run runs the whole suite against stores made by newStore.
func Run(t *testing.T, newStore NewStore) {
	open := func(t *testing.T, o Options) journal.Store {
		t.Helper()
		s := newStore(t, o)
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
		return s
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, open func(*testing.T, Options) journal.Store)
	}{
		{"GetPutDelete", testGetPutDelete},
		{"ScanOrderAndBounds", testScan},
		{"WriteLimits", testWriteLimits},
		{"ReadYourWrites", testReadYourWrites},
		{"ScanSeesWritesBeforeItStarted", testScanStableUnderWrites},
		{"FnErrorWritesNothing", testFnErrorWritesNothing},
		{"EmptyUpdate", testEmptyUpdate},
		{"ViewIsConsistentSnapshot", testViewSnapshot},
		{"UpdatesSerialise", testUpdatesSerialise},
		{"Cancellation", testCancellation},
		{"UseAfterEnd", testUseAfterEnd},
		{"Clock", testClock},
		{"Close", testClose},
		{"Failpoints", testFailpoints},
		{"EventsAppendAndRead", testEvents},
		{"EventsSeqGaplessAcrossAborts", testEventsGapless},
		{"EventsNotifyAndFollow", testFollow},
		{"EventsPaging", testEventsPaging},
		{"Idempotency", testIdempotency},
		{"IdempotencyConcurrent", testIdempotencyConcurrent},
		{"IdempotencyLargeResults", testIdempotencyLargeResults},
		{"IdempotencyExpiry", testIdempotencyExpiry},
		{"Records", testRecords},
		{"RecordTransitions", testRecordTransitions},
		{"Ancestors", testAncestors},
		{"Leases", testLeases},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

var errSentinel = errors.New("sentinel from fn")

func put(t *testing.T, s journal.Store, kvs ...string) {
	t.Helper()
	if err := s.Update(context.Background(), func(tx journal.Tx) error {
		for i := 0; i < len(kvs); i += 2 {
			if err := tx.Put([]byte(kvs[i]), []byte(kvs[i+1])); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("put: %v", err)
	}
}

func get(t *testing.T, s journal.Store, key string) (string, error) {
	t.Helper()
	var v []byte
	err := s.View(context.Background(), func(r journal.Reader) error {
		var err error
		v, err = r.Get([]byte(key))
		return err
	})
	return string(v), err
}

func mustGet(t *testing.T, s journal.Store, key, want string) {
	t.Helper()
	got, err := get(t, s, key)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	if got != want {
		t.Fatalf("get %q = %q, want %q", key, got, want)
	}
}

func mustNotFound(t *testing.T, s journal.Store, key string) {
	t.Helper()
	if v, err := get(t, s, key); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("get %q = %q, %v; want ErrNotFound", key, v, err)
	}
}

// scanAll returns "k=v" for every key in [start, end) outside sys/.
func scanAll(t *testing.T, r journal.Reader, start, end string) []string {
	t.Helper()
	var e []byte
	if end != "" {
		e = []byte(end)
	}
	var out []string
	if err := r.Scan([]byte(start), e, func(k, v []byte) error {
		if !bytes.HasPrefix(k, []byte(journal.ReservedPrefix)) {
			out = append(out, string(k)+"="+string(v))
		}
		return nil
	}); err != nil {
		t.Fatalf("scan [%q, %q): %v", start, end, err)
	}
	return out
}

func viewScan(t *testing.T, s journal.Store, start, end string) []string {
	t.Helper()
	var out []string
	if err := s.View(context.Background(), func(r journal.Reader) error {
		out = scanAll(t, r, start, end)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func equal(a, b []string) bool {
	return strings.Join(a, "\n") == strings.Join(b, "\n") && len(a) == len(b)
}

func testGetPutDelete(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	mustNotFound(t, s, "a")
	put(t, s, "a", "1", "b", "")
	mustGet(t, s, "a", "1")
	mustGet(t, s, "b", "")
	put(t, s, "a", "2")
	mustGet(t, s, "a", "2")
	if err := s.Update(context.Background(), func(tx journal.Tx) error {
		if err := tx.Delete([]byte("a")); err != nil {
			return err
		}
		return tx.Delete([]byte("never-existed"))
	}); err != nil {
		t.Fatal(err)
	}
	mustNotFound(t, s, "a")
	mustGet(t, s, "b", "")

	// Get returns a copy: changing it must not change the store.
	if err := s.View(context.Background(), func(r journal.Reader) error {
		v, err := r.Get([]byte("b"))
		if err != nil {
			return err
		}
		v = append(v, 'x')
		_ = v
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(context.Background(), func(tx journal.Tx) error {
		val := []byte("kept")
		if err := tx.Put([]byte("c"), val); err != nil {
			return err
		}
		copy(val, "XXXX") // Put copied it
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, "c", "kept")
}

func testScan(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	put(t, s, "b/2", "x", "a", "0", "b/1", "y", "b/", "z", "b0", "w", "c", "c", "b/3", "")
	tests := []struct {
		start, end string
		want       []string
	}{
		{"", "", []string{"a=0", "b/=z", "b/1=y", "b/2=x", "b/3=", "b0=w", "c=c"}},
		{"b/", "b0", []string{"b/=z", "b/1=y", "b/2=x", "b/3="}},
		{"b/1", "b/3", []string{"b/1=y", "b/2=x"}},
		{"b0", "", []string{"b0=w", "c=c"}},
		{"d", "", nil},
		{"b/2", "b/2", nil},
	}
	for _, tc := range tests {
		if got := viewScan(t, s, tc.start, tc.end); !equal(got, tc.want) {
			t.Errorf("scan [%q, %q) = %q, want %q", tc.start, tc.end, got, tc.want)
		}
	}
	if err := s.View(context.Background(), func(r journal.Reader) error {
		var got []string
		if err := journal.ScanPrefix(r, []byte("b/"), func(k, _ []byte) error {
			got = append(got, string(k))
			return nil
		}); err != nil {
			return err
		}
		if want := []string{"b/", "b/1", "b/2", "b/3"}; !equal(got, want) {
			t.Errorf("ScanPrefix(b/) = %q, want %q", got, want)
		}
		got = nil
		if err := r.Scan([]byte("a"), nil, func(k, _ []byte) error {
			got = append(got, string(k))
			if len(got) == 2 {
				return journal.ErrStop
			}
			return nil
		}); err != nil {
			t.Errorf("scan stopped by ErrStop returned %v, want nil", err)
		}
		if len(got) != 2 {
			t.Errorf("ErrStop after 2 keys: saw %d", len(got))
		}
		err := r.Scan([]byte("a"), nil, func(k, _ []byte) error { return errSentinel })
		if !errors.Is(err, errSentinel) {
			t.Errorf("scan with failing fn returned %v, want the fn's error", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func testWriteLimits(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	tests := []struct {
		name  string
		key   []byte
		value []byte
	}{
		{"empty key", nil, []byte("v")},
		{"key too long", bytes.Repeat([]byte("k"), journal.MaxKeySize+1), nil},
		{"value too long", []byte("k"), make([]byte, journal.MaxValueSize+1)},
		{"reserved prefix", []byte(journal.ReservedPrefix + "x"), []byte("v")},
	}
	for _, tc := range tests {
		err := s.Update(context.Background(), func(tx journal.Tx) error { return tx.Put(tc.key, tc.value) })
		if !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("put %s: %v, want ErrInvalidArgument", tc.name, err)
		}
	}
	err := s.Update(context.Background(), func(tx journal.Tx) error {
		return tx.Delete([]byte(journal.ReservedPrefix + "schema"))
	})
	if !errors.Is(err, journal.ErrInvalidArgument) {
		t.Errorf("delete of a reserved key: %v, want ErrInvalidArgument", err)
	}
	// The limits themselves are allowed.
	put(t, s, string(bytes.Repeat([]byte("k"), journal.MaxKeySize)), string(make([]byte, journal.MaxValueSize)))
}

func testReadYourWrites(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	put(t, s, "k/1", "old", "k/2", "two", "k/3", "three")
	err := s.Update(context.Background(), func(tx journal.Tx) error {
		if err := tx.Put([]byte("k/1"), []byte("new")); err != nil {
			return err
		}
		if err := tx.Put([]byte("k/0"), []byte("zero")); err != nil {
			return err
		}
		if err := tx.Delete([]byte("k/2")); err != nil {
			return err
		}
		if v, err := tx.Get([]byte("k/1")); err != nil || string(v) != "new" {
			t.Errorf("get own write = %q, %v; want new", v, err)
		}
		if _, err := tx.Get([]byte("k/2")); !errors.Is(err, journal.ErrNotFound) {
			t.Errorf("get own delete: %v, want ErrNotFound", err)
		}
		want := []string{"k/0=zero", "k/1=new", "k/3=three"}
		if got := scanAll(t, tx, "k/", "k0"); !equal(got, want) {
			t.Errorf("scan in tx = %q, want %q", got, want)
		}
		// Delete then re-put within one transaction.
		if err := tx.Delete([]byte("k/3")); err != nil {
			return err
		}
		if err := tx.Put([]byte("k/3"), []byte("again")); err != nil {
			return err
		}
		if v, err := tx.Get([]byte("k/3")); err != nil || string(v) != "again" {
			t.Errorf("get after delete+put = %q, %v", v, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := viewScan(t, s, "k/", "k0"), []string{"k/0=zero", "k/1=new", "k/3=again"}; !equal(got, want) {
		t.Errorf("after commit = %q, want %q", got, want)
	}
}

func testScanStableUnderWrites(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	put(t, s, "s/1", "a", "s/3", "c")
	err := s.Update(context.Background(), func(tx journal.Tx) error {
		if err := tx.Put([]byte("s/2"), []byte("b")); err != nil {
			return err
		}
		var seen []string
		if err := tx.Scan([]byte("s/"), []byte("s0"), func(k, v []byte) error {
			seen = append(seen, string(k))
			// Writes during the scan, ahead of its position.
			return tx.Put([]byte(string(k)+"x"), []byte("new"))
		}); err != nil {
			return err
		}
		if want := []string{"s/1", "s/2", "s/3"}; !equal(seen, want) {
			t.Errorf("scan while writing saw %q, want %q (writes made during a scan must not appear in it)", seen, want)
		}
		if got := scanAll(t, tx, "s/", "s0"); len(got) != 6 {
			t.Errorf("a later scan sees %q, want the 3 new keys too", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func testFnErrorWritesNothing(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	put(t, s, "keep", "1")
	notify := s.Notify()
	err := s.Update(context.Background(), func(tx journal.Tx) error {
		for i := range 100 {
			if err := tx.Put([]byte(fmt.Sprintf("x/%03d", i)), []byte("v")); err != nil {
				return err
			}
		}
		if err := tx.Delete([]byte("keep")); err != nil {
			return err
		}
		if err := tx.AppendEvent(journal.Event{Type: "test.aborted"}); err != nil {
			return err
		}
		return fmt.Errorf("wrapped: %w", errSentinel)
	})
	if !errors.Is(err, errSentinel) {
		t.Fatalf("Update returned %v, want fn's error", err)
	}
	if got := viewScan(t, s, "x/", "x0"); len(got) != 0 {
		t.Errorf("aborted update left %d keys", len(got))
	}
	mustGet(t, s, "keep", "1")
	if seq, err := journal.LastSeq(context.Background(), s); err != nil || seq != 0 {
		t.Errorf("LastSeq after aborted append = %d, %v; want 0", seq, err)
	}
	select {
	case <-notify:
		t.Error("Notify fired for an aborted update")
	default:
	}
}

func testEmptyUpdate(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	called := false
	if err := s.Update(context.Background(), func(tx journal.Tx) error {
		called = true
		_, err := tx.Get([]byte("nothing"))
		if !errors.Is(err, journal.ErrNotFound) {
			return err
		}
		return nil
	}); err != nil || !called {
		t.Fatalf("read-only update: called=%v err=%v", called, err)
	}
}

// testViewSnapshot runs writers that keep a set of keys equal to each other
// (and move a marker key around) while readers check, within one View, that
// every read agrees: a View that saw half of an Update, or moved between
// Updates, fails.
func testViewSnapshot(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	const nkeys = 20
	write := func(gen int) error {
		return s.Update(context.Background(), func(tx journal.Tx) error {
			for i := range nkeys {
				if err := tx.Put([]byte(fmt.Sprintf("snap/%02d", i)), []byte(fmt.Sprint(gen))); err != nil {
					return err
				}
			}
			if gen > 0 {
				if err := tx.Delete([]byte(fmt.Sprintf("mark/%d", gen-1))); err != nil {
					return err
				}
			}
			return tx.Put([]byte(fmt.Sprintf("mark/%d", gen)), []byte(fmt.Sprint(gen)))
		})
	}
	if err := write(0); err != nil {
		t.Fatal(err)
	}
	const gens = 80
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for g := 1; g <= gens; g++ {
			if err := write(g); err != nil {
				errc <- err
				return
			}
		}
	}()
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range gens {
				err := s.View(context.Background(), func(r journal.Reader) error {
					first, err := r.Get([]byte("snap/00"))
					if err != nil {
						return err
					}
					var marks []string
					if err := journal.ScanPrefix(r, []byte("mark/"), func(k, v []byte) error {
						marks = append(marks, string(v))
						return nil
					}); err != nil {
						return err
					}
					if len(marks) != 1 || marks[0] != string(first) {
						return fmt.Errorf("snapshot torn: snap/00=%s, marks %q", first, marks)
					}
					n := 0
					if err := journal.ScanPrefix(r, []byte("snap/"), func(k, v []byte) error {
						n++
						if !bytes.Equal(v, first) {
							return fmt.Errorf("snapshot torn: %s=%s but snap/00=%s", k, v, first)
						}
						return nil
					}); err != nil {
						return err
					}
					last, err := r.Get([]byte(fmt.Sprintf("snap/%02d", nkeys-1)))
					if err != nil {
						return err
					}
					if !bytes.Equal(last, first) || n != nkeys {
						return fmt.Errorf("snapshot moved: snap/00=%s, last=%s, %d keys", first, last, n)
					}
					return nil
				})
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func testUpdatesSerialise(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	const workers, each = 32, 10
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				err := s.Update(context.Background(), func(tx journal.Tx) error {
					_, err := journal.Increment(tx, "serial")
					if err != nil {
						return err
					}
					return tx.AppendEvent(journal.Event{Type: "test.increment"})
				})
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	var got, seq uint64
	if err := s.View(context.Background(), func(r journal.Reader) error {
		var err error
		if got, err = journal.Counter(r, "serial"); err != nil {
			return err
		}
		seq, err = r.LastSeq()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got != workers*each || seq != workers*each {
		t.Fatalf("after %d concurrent increments: counter %d, last event seq %d", workers*each, got, seq)
	}
}

func testCancellation(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	if err := s.View(ctx, func(journal.Reader) error { called = true; return nil }); !errors.Is(err, context.Canceled) || called {
		t.Errorf("View with a cancelled context: %v, fn called %v", err, called)
	}
	if err := s.Update(ctx, func(journal.Tx) error { called = true; return nil }); !errors.Is(err, context.Canceled) || called {
		t.Errorf("Update with a cancelled context: %v, fn called %v", err, called)
	}

	// Cancelled while fn runs: nothing commits.
	ctx, cancel = context.WithCancel(context.Background())
	err := s.Update(ctx, func(tx journal.Tx) error {
		if err := tx.Put([]byte("cancelled"), []byte("1")); err != nil {
			return err
		}
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Update cancelled inside fn: %v, want context.Canceled", err)
	}
	mustNotFound(t, s, "cancelled")

	// An Update whose context ends while it waits, whether for a writer
	// lock (pebble, mem: fn never runs) or while fn runs next to another
	// transaction (optimistic stores), gives up and commits nothing.
	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Update(context.Background(), func(tx journal.Tx) error {
			select {
			case <-held:
			default:
				close(held)
			}
			<-release
			return tx.Put([]byte("holder"), []byte("1"))
		})
	}()
	<-held
	ctx, cancel = context.WithCancel(context.Background())
	waiting := make(chan error, 1)
	go func() {
		waiting <- s.Update(ctx, func(tx journal.Tx) error {
			if err := tx.Put([]byte("waiter"), []byte("1")); err != nil {
				return err
			}
			<-ctx.Done()
			return nil
		})
	}()
	cancel()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Errorf("Update whose context ended while it waited: %v, want context.Canceled", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mustNotFound(t, s, "waiter")
	mustGet(t, s, "holder", "1")

	// A long scan notices the end of its context.
	if err := s.Update(context.Background(), func(tx journal.Tx) error {
		for i := range 1000 {
			if err := tx.Put([]byte(fmt.Sprintf("long/%04d", i)), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	n := 0
	err = s.View(ctx, func(r journal.Reader) error {
		return journal.ScanPrefix(r, []byte("long/"), func(_, _ []byte) error {
			n++
			if n == 10 {
				cancel()
			}
			return nil
		})
	})
	if !errors.Is(err, context.Canceled) || n == 1000 {
		t.Errorf("scan cancelled at key 10: %v after %d keys, want context.Canceled before the end", err, n)
	}
}

func testUseAfterEnd(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	put(t, s, "a", "1")
	var leakedR journal.Reader
	var leakedTx journal.Tx
	if err := s.View(context.Background(), func(r journal.Reader) error { leakedR = r; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(context.Background(), func(tx journal.Tx) error { leakedTx = tx; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := leakedR.Get([]byte("a")); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("Get on a Reader after its View: %v, want ErrFailedPrecondition", err)
	}
	if err := leakedR.Scan(nil, nil, func(_, _ []byte) error { return nil }); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("Scan on a Reader after its View: %v, want ErrFailedPrecondition", err)
	}
	if err := leakedTx.Put([]byte("b"), nil); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("Put on a Tx after its Update: %v, want ErrFailedPrecondition", err)
	}
	if err := leakedTx.AppendEvent(journal.Event{Type: "x.y"}); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("AppendEvent on a Tx after its Update: %v, want ErrFailedPrecondition", err)
	}
	mustNotFound(t, s, "b")
}

func testClock(t *testing.T, open func(*testing.T, Options) journal.Store) {
	at := time.Date(2031, 2, 3, 4, 5, 6, 7000, time.FixedZone("x", 3600))
	s := open(t, Options{Now: func() time.Time { return at }})
	if err := s.Update(context.Background(), func(tx journal.Tx) error {
		if !tx.Now().Equal(at) || tx.Now().Location() != time.UTC {
			t.Errorf("tx.Now() = %v, want %v in UTC", tx.Now(), at)
		}
		return tx.AppendEvent(journal.Event{Type: "test.clock"})
	}); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := s.View(context.Background(), func(r journal.Reader) error {
		return r.Events(0, func(ev journal.Event) error {
			n++
			if !ev.Time.Equal(at) {
				t.Errorf("event time %v, want the transaction's %v", ev.Time, at)
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("%d events, want 1", n)
	}
}

func testClose(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	ch := s.Notify()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Error("Close left a Notify channel open")
	}
	<-s.Notify() // must not block
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.View(context.Background(), func(journal.Reader) error { return nil }); !errors.Is(err, journal.ErrClosed) {
		t.Errorf("View after Close: %v", err)
	}
	if err := s.Update(context.Background(), func(journal.Tx) error { return nil }); !errors.Is(err, journal.ErrClosed) {
		t.Errorf("Update after Close: %v", err)
	}
	if err := journal.Follow(context.Background(), s, 0, journal.EventFilter{}, func(journal.Event) error { return nil }); !errors.Is(err, journal.ErrClosed) {
		t.Errorf("Follow on a closed store: %v, want ErrClosed", err)
	}
}

func testFailpoints(t *testing.T, open func(*testing.T, Options) journal.Store) {
	var mu sync.Mutex
	armed := ""
	hits := map[string]int{}
	errInjected := errors.New("injected")
	s := open(t, Options{Failpoint: func(name string) error {
		mu.Lock()
		defer mu.Unlock()
		hits[name]++
		if name == armed {
			return errInjected
		}
		return nil
	}})
	arm := func(name string) {
		mu.Lock()
		armed = name
		mu.Unlock()
	}
	write := func(key string) error {
		return s.Update(context.Background(), func(tx journal.Tx) error {
			if err := tx.Put([]byte(key), []byte("v")); err != nil {
				return err
			}
			return tx.AppendEvent(journal.Event{Type: "test.failpoint"})
		})
	}
	if err := write("plain"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{journal.FailpointUpdateBegin, journal.FailpointUpdateBeforeCommit, journal.FailpointUpdateAfterCommit} {
		if hits[name] != 1 {
			t.Errorf("failpoint %s evaluated %d times in one update, want 1", name, hits[name])
		}
	}
	tests := []struct {
		point     string
		committed bool
	}{
		{journal.FailpointUpdateBegin, false},
		{journal.FailpointUpdateBeforeCommit, false},
		{journal.FailpointUpdateAfterCommit, true},
	}
	for _, tc := range tests {
		arm(tc.point)
		key := "fp/" + tc.point
		before, _ := journal.LastSeq(context.Background(), s)
		if err := write(key); !errors.Is(err, errInjected) {
			t.Errorf("%s: Update returned %v, want the injected error", tc.point, err)
		}
		arm("")
		_, err := get(t, s, key)
		after, _ := journal.LastSeq(context.Background(), s)
		if committed := err == nil; committed != tc.committed || (after == before+1) != tc.committed {
			t.Errorf("%s: key present %v, event seq %d→%d; want committed=%v", tc.point, committed, before, after, tc.committed)
		}
	}
}
