package journaltest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/journal"
)

type bumpRequest struct {
	Counter string          `json:"counter"`
	By      int             `json:"by"`
	State   json.RawMessage `json:"state,omitempty"`
}

type bumpResult struct {
	Value   uint64 `json:"value"`
	Comment string `json:"comment"`
}

// bump is an idempotent operation: add req.By to a counter, append an event.
func bump(ctx context.Context, s journal.Store, key string, req bumpRequest, runs *atomic.Int32) ([]byte, bool, error) {
	return journal.DoIdempotent(ctx, s, key, "bump", req, func(tx journal.Tx) (any, error) {
		runs.Add(1)
		var v uint64
		for range req.By {
			var err error
			if v, err = journal.Increment(tx, req.Counter); err != nil {
				return nil, err
			}
		}
		if err := tx.AppendEvent(journal.Event{Type: "test.bump", IdempotencyKey: key}); err != nil {
			return nil, err
		}
		return bumpResult{Value: v, Comment: "<&> kept verbatim"}, nil
	})
}

func counter(t *testing.T, s journal.Store, name string) uint64 {
	t.Helper()
	var v uint64
	if err := s.View(context.Background(), func(r journal.Reader) error {
		var err error
		v, err = journal.Counter(r, name)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

func testIdempotency(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	ctx := context.Background()
	var runs atomic.Int32
	req := bumpRequest{Counter: "c", By: 3, State: json.RawMessage(`{"b": 1, "a": [1, 2]}`)}

	first, replayed, err := bump(ctx, s, "key-1", req, &runs)
	if err != nil || replayed {
		t.Fatalf("first call: replayed %v, err %v", replayed, err)
	}
	var res bumpResult
	if err := json.Unmarshal(first, &res); err != nil || res.Value != 3 {
		t.Fatalf("first result %s (%v)", first, err)
	}
	for range 50 {
		again, replayed, err := bump(ctx, s, "key-1", req, &runs)
		if err != nil || !replayed || !bytes.Equal(again, first) {
			t.Fatalf("replay: %s replayed=%v err=%v; want %s unchanged", again, replayed, err, first)
		}
	}
	// The same request with its raw JSON spelled differently is the same.
	same := req
	same.State = json.RawMessage(`{"a":[1,2],"b":1}`)
	if again, replayed, err := bump(ctx, s, "key-1", same, &runs); err != nil || !replayed || !bytes.Equal(again, first) {
		t.Fatalf("replay with reformatted JSON: %s, %v, %v", again, replayed, err)
	}
	if runs.Load() != 1 || counter(t, s, "c") != 3 {
		t.Fatalf("after replays: fn ran %d times, counter %d; want 1 and 3", runs.Load(), counter(t, s, "c"))
	}
	if seq, _ := journal.LastSeq(ctx, s); seq != 1 {
		t.Fatalf("replays appended events: last seq %d", seq)
	}

	// The same key with another request, or another op, is a conflict.
	other := req
	other.By = 4
	if _, _, err := bump(ctx, s, "key-1", other, &runs); !errors.Is(err, journal.ErrConflict) || !strings.Contains(err.Error(), "key-1") {
		t.Errorf("different request, same key: %v; want ErrConflict naming the key", err)
	}
	_, _, err = journal.DoIdempotent(ctx, s, "key-1", "other-op", req, func(journal.Tx) (any, error) { return 1, nil })
	if !errors.Is(err, journal.ErrConflict) {
		t.Errorf("different op, same key: %v; want ErrConflict", err)
	}

	// A failed operation records nothing: the key stays free.
	_, _, err = journal.DoIdempotent(ctx, s, "key-2", "bump", req, func(tx journal.Tx) (any, error) {
		if _, err := journal.Increment(tx, "c"); err != nil {
			return nil, err
		}
		return nil, errSentinel
	})
	if !errors.Is(err, errSentinel) {
		t.Fatalf("failing op: %v", err)
	}
	if _, replayed, err := bump(ctx, s, "key-2", req, &runs); err != nil || replayed {
		t.Fatalf("retry after failure: replayed %v, err %v; want a fresh run", replayed, err)
	}
	if c := counter(t, s, "c"); c != 6 {
		t.Fatalf("counter %d, want 6 (the failed run left nothing)", c)
	}

	// The lower-level pair, as an operation composing its own Update uses it.
	if err := s.Update(ctx, func(tx journal.Tx) error {
		res, found, err := journal.CheckIdempotency(tx, "key-1", "bump", req)
		if err != nil || !found || !bytes.Equal(res, first) {
			t.Errorf("CheckIdempotency(key-1) = %s, %v, %v", res, found, err)
		}
		if _, found, err := journal.CheckIdempotency(tx, "key-3", "bump", req); err != nil || found {
			t.Errorf("CheckIdempotency(free key) found=%v err=%v", found, err)
		}
		if _, err := journal.RecordResult(tx, "key-1", "bump", req, 1); !errors.Is(err, journal.ErrExists) {
			t.Errorf("RecordResult over a taken key: %v, want ErrExists", err)
		}
		stored, err := journal.RecordResult(tx, "key-3", "bump", req, json.RawMessage(`{"x": 1}`))
		if err != nil || string(stored) != `{"x":1}` {
			t.Errorf("RecordResult = %s, %v", stored, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	for _, bad := range []string{"", strings.Repeat("k", journal.MaxIdempotencyKeyLen+1), "tab\tkey", "\xff"} {
		if _, _, err := bump(ctx, s, bad, req, &runs); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("key %q: %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func testIdempotencyConcurrent(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	var runs atomic.Int32
	req := bumpRequest{Counter: "cc", By: 1}
	const n = 16
	results := make([][]byte, n)
	replays := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			results[i], replays[i], err = bump(context.Background(), s, "same-key", req, &runs)
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	fresh := 0
	for i := range n {
		if !replays[i] {
			fresh++
		}
		if !bytes.Equal(results[i], results[0]) {
			t.Errorf("result %d = %s, result 0 = %s", i, results[i], results[0])
		}
	}
	if fresh != 1 || counter(t, s, "cc") != 1 {
		t.Fatalf("%d concurrent deliveries: %d fresh runs, counter %d; want 1 and 1", n, fresh, counter(t, s, "cc"))
	}
}

// testIdempotencyLargeResults: a result larger than a stored value may be
// is recorded in parts and replayed byte for byte; a damaged part is
// corrupt, never a wrong result; a result over the limit records nothing.
func testIdempotencyLargeResults(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	ctx := context.Background()
	// Results just inline, just in parts, and of several parts; each
	// distinct byte by byte, so a part out of order would show.
	sizes := []int{journal.InlineResultSize - 16, journal.InlineResultSize + 1, 3*journal.MaxValueSize + 12345}
	do := func(key string, size int, runs *atomic.Int32) ([]byte, bool, error) {
		return journal.DoIdempotent(ctx, s, key, "big", size, func(tx journal.Tx) (any, error) {
			runs.Add(1)
			if _, err := journal.Increment(tx, "big"); err != nil {
				return nil, err
			}
			return json.RawMessage(`"` + counting(size-2) + `"`), nil
		})
	}
	var runs atomic.Int32
	for i, size := range sizes {
		key := fmt.Sprintf("big-%d", i)
		first, replayed, err := do(key, size, &runs)
		if err != nil || replayed || len(first) != size || !json.Valid(first) {
			t.Fatalf("result of %d bytes: got %d bytes, replayed %v, %v", size, len(first), replayed, err)
		}
		again, replayed, err := do(key, size, &runs)
		if err != nil || !replayed || !bytes.Equal(again, first) {
			t.Fatalf("replay of a %d-byte result: %d bytes, replayed %v, %v", size, len(again), replayed, err)
		}
		if err := s.View(ctx, func(r journal.Reader) error {
			e, err := journal.GetIdempotency(r, key)
			if err == nil && !bytes.Equal(e.Result, first) {
				err = fmt.Errorf("GetIdempotency: %d bytes, not the result", len(e.Result))
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != int32(len(sizes)) || counter(t, s, "big") != uint64(len(sizes)) {
		t.Fatalf("fn ran %d times, counter %d; want %d", runs.Load(), counter(t, s, "big"), len(sizes))
	}

	// Damage the parts of the largest result: a part rewritten, then gone.
	key := fmt.Sprintf("big-%d", len(sizes)-1)
	var part []byte
	if err := s.View(ctx, func(r journal.Reader) error {
		return journal.ScanPrefix(r, []byte("idem-part/"+key+"/"), func(k, _ []byte) error {
			part = append(part[:0], k...)
			return nil
		})
	}); err != nil || part == nil {
		t.Fatalf("no parts stored under idem-part/%s/: %v", key, err)
	}
	for _, damage := range []func(tx journal.Tx) error{
		func(tx journal.Tx) error { return tx.Put(part, []byte("9,9,9\"")) },
		func(tx journal.Tx) error { return tx.Delete(part) },
	} {
		if err := s.Update(ctx, damage); err != nil {
			t.Fatal(err)
		}
		if _, _, err := do(key, sizes[len(sizes)-1], &runs); !errors.Is(err, journal.ErrCorrupt) {
			t.Fatalf("replay with a damaged part: %v, want corrupt", err)
		}
	}

	// Over the limit: an error, nothing applied, the key still free.
	before := counter(t, s, "big")
	if _, _, err := do("too-big", journal.MaxResultSize+1, &runs); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Fatalf("result over the limit: %v, want invalid argument", err)
	}
	if got := counter(t, s, "big"); got != before {
		t.Fatalf("an operation whose result was refused was applied: counter %d -> %d", before, got)
	}
	if _, replayed, err := do("too-big", 100, &runs); err != nil || replayed {
		t.Fatalf("the refused key is not free: replayed %v, %v", replayed, err)
	}
}

// counting is "0,1,2,...," cut to n bytes, built in blocks so a large one
// is cheap: every 10000 numbers the block repeats with a new prefix.
func counting(n int) string {
	var block strings.Builder
	for i := range 10000 {
		fmt.Fprintf(&block, "%d,", i)
	}
	var b strings.Builder
	b.Grow(n + block.Len())
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%d:", i)
		b.WriteString(block.String())
	}
	return b.String()[:n]
}

// testIdempotencyExpiry: an entry recorded with a ttl replays until it
// expires and ExpireIdempotency deletes it (result parts and index too);
// then the key runs afresh. Entries without a ttl are never deleted, and a
// limit bounds one call.
func testIdempotencyExpiry(t *testing.T, open func(*testing.T, Options) journal.Store) {
	var clock atomic.Int64
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock.Store(t0.UnixNano())
	s := open(t, Options{Now: func() time.Time { return time.Unix(0, clock.Load()).UTC() }})
	ctx := context.Background()
	var runs atomic.Int32
	do := func(key string, ttl time.Duration, size int) (bool, error) {
		_, replayed, err := journal.DoIdempotentFor(ctx, s, key, "op", size, ttl, func(tx journal.Tx) (any, error) {
			runs.Add(1)
			return json.RawMessage(`"` + counting(size) + `"`), nil
		})
		return replayed, err
	}
	expire := func(limit int) int {
		t.Helper()
		var n int
		if err := s.Update(ctx, func(tx journal.Tx) (err error) {
			n, err = journal.ExpireIdempotency(tx, time.Unix(0, clock.Load()), limit)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	keys := func(prefix string) int {
		t.Helper()
		n := 0
		if err := s.View(ctx, func(r journal.Reader) error {
			return journal.ScanPrefix(r, []byte(prefix), func([]byte, []byte) error { n++; return nil })
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	big := 2*journal.MaxValueSize + 1 // three parts
	for i, ttl := range []time.Duration{time.Hour, time.Hour, 2 * time.Hour, 0} {
		size := 10
		if i == 1 {
			size = big
		}
		if _, err := do(fmt.Sprintf("k%d", i), ttl, size); err != nil {
			t.Fatal(err)
		}
	}
	if n := expire(100); n != 0 {
		t.Fatalf("expired %d entries before their time", n)
	}
	clock.Add(int64(time.Hour)) // k0 and k1 are due (at, not after)
	if n := expire(1); n != 1 {
		t.Fatalf("expire with limit 1: %d", n)
	}
	if n := expire(100); n != 1 {
		t.Fatalf("second expire: %d, want the other due entry", n)
	}
	if got := keys("idem-part/"); got != 0 {
		t.Fatalf("%d result parts left after their entry expired", got)
	}
	if got := keys("idx/idem-expiry/"); got != 1 {
		t.Fatalf("expiry index holds %d keys, want k2's", got)
	}
	runs.Store(0)
	for key, wantReplay := range map[string]bool{"k0": false, "k2": true, "k3": true} {
		if replayed, err := do(key, time.Hour, 10); err != nil || replayed != wantReplay {
			t.Errorf("%s after the expiry: replayed %v (want %v), %v", key, replayed, wantReplay, err)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("operations run after the expiry: %d, want 1 (k0 afresh)", runs.Load())
	}
	clock.Add(int64(365 * 24 * time.Hour))
	if n := expire(100); n != 2 {
		t.Fatalf("a year on: %d expired, want k0 (recorded again) and k2", n)
	}
	if got := keys("idem/"); got != 1 {
		t.Fatalf("%d entries left, want k3's (no ttl)", got)
	}
}
