package journaltest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

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
		if _, err := tx.AppendEvent(journal.Event{Type: "test.bump", IdempotencyKey: key}); err != nil {
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
