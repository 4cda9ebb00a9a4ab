package journaltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/esf-dev/esf/journal"
)

// appendEvents appends evs in one Update and returns the Seqs they got,
// read back from the log: the stores assign them at commit.
func appendEvents(t *testing.T, s journal.Store, evs ...journal.Event) []uint64 {
	t.Helper()
	if err := s.Update(context.Background(), func(tx journal.Tx) error {
		for _, ev := range evs {
			if err := tx.AppendEvent(ev); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("append events: %v", err)
	}
	last, err := journal.LastSeq(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for i := range evs {
		seqs = append(seqs, last-uint64(len(evs)-1-i))
	}
	return seqs
}

func collect(t *testing.T, s journal.Store, after uint64, f journal.EventFilter) ([]journal.Event, uint64) {
	t.Helper()
	var evs []journal.Event
	last, err := journal.Events(context.Background(), s, after, f, func(ev journal.Event) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatalf("events after %d: %v", after, err)
	}
	return evs, last
}

func seqsOf(evs []journal.Event) []uint64 {
	out := make([]uint64, len(evs))
	for i, ev := range evs {
		out[i] = ev.Seq
	}
	return out
}

func testEvents(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	const g1, g2 = "grp_1", "grp_2"
	seqs := appendEvents(t, s,
		journal.Event{Type: journal.EventGroupCreated, GroupID: g1, TraceID: "0123456789abcdef0123456789abcdef"},
		journal.Event{Type: journal.EventNodeForked, GroupID: g1, NodeID: "node_a", Data: json.RawMessage(`{"n": 1}`)},
	)
	if fmt.Sprint(seqs) != "[1 2]" {
		t.Fatalf("first seqs %v, want [1 2]", seqs)
	}
	appendEvents(t, s,
		journal.Event{Type: journal.EventGroupCreated, GroupID: g2},
		journal.Event{Type: journal.EventAttemptState, GroupID: g1, NodeID: "node_a", AttemptID: "att_x"},
	)

	all, last := collect(t, s, 0, journal.EventFilter{})
	if fmt.Sprint(seqsOf(all)) != "[1 2 3 4]" || last != 4 {
		t.Fatalf("all events: seqs %v, last %d", seqsOf(all), last)
	}
	if all[0].TraceID != "0123456789abcdef0123456789abcdef" || string(all[1].Data) != `{"n":1}` && string(all[1].Data) != `{"n": 1}` {
		t.Errorf("event fields not kept: %+v %+v", all[0], all[1])
	}
	if all[0].Time.IsZero() {
		t.Error("event time not set")
	}

	tests := []struct {
		name  string
		after uint64
		f     journal.EventFilter
		want  string
	}{
		{"after 2", 2, journal.EventFilter{}, "[3 4]"},
		{"after last", 4, journal.EventFilter{}, "[]"},
		{"group", 0, journal.EventFilter{GroupID: g1}, "[1 2 4]"},
		{"node", 0, journal.EventFilter{NodeID: "node_a"}, "[2 4]"},
		{"attempt", 0, journal.EventFilter{AttemptID: "att_x"}, "[4]"},
		{"type", 0, journal.EventFilter{Types: []string{journal.EventGroupCreated}}, "[1 3]"},
		{"type wildcard", 0, journal.EventFilter{Types: []string{"node.*", "attempt.*"}}, "[2 4]"},
		{"group and type", 0, journal.EventFilter{GroupID: g2, Types: []string{"group.*"}}, "[3]"},
	}
	for _, tc := range tests {
		evs, last := collect(t, s, tc.after, tc.f)
		if got := fmt.Sprint(seqsOf(evs)); got != tc.want {
			t.Errorf("%s: seqs %s, want %s", tc.name, got, tc.want)
		}
		// The position always advances past filtered-out events.
		if last != 4 {
			t.Errorf("%s: continue position %d, want 4", tc.name, last)
		}
	}

	// ErrStop from the consumer ends the walk at that event.
	var got []uint64
	last, err := journal.Events(context.Background(), s, 0, journal.EventFilter{}, func(ev journal.Event) error {
		got = append(got, ev.Seq)
		if ev.Seq == 2 {
			return journal.ErrStop
		}
		return nil
	})
	if err != nil || last != 2 || len(got) != 2 {
		t.Errorf("stop at 2: last %d, got %v, err %v", last, got, err)
	}
	last, err = journal.Events(context.Background(), s, 0, journal.EventFilter{}, func(ev journal.Event) error {
		if ev.Seq == 3 {
			return errSentinel
		}
		return nil
	})
	if !errors.Is(err, errSentinel) || last != 2 {
		t.Errorf("consumer error at 3: last %d, err %v; want 2 and the error", last, err)
	}

	// Inside an Update, the log is the committed one: the transaction's
	// own appends get their Seq at commit.
	if err := s.Update(context.Background(), func(tx journal.Tx) error {
		if err := tx.AppendEvent(journal.Event{Type: "test.own"}); err != nil {
			return err
		}
		if ls, err := tx.LastSeq(); err != nil || ls != 4 {
			t.Errorf("tx.LastSeq after an append = %d, %v; want 4 (the committed log)", ls, err)
		}
		var seen []uint64
		if err := tx.Events(2, func(ev journal.Event) error { seen = append(seen, ev.Seq); return nil }); err != nil {
			return err
		}
		if fmt.Sprint(seen) != "[3 4]" {
			t.Errorf("tx.Events(2) after an append = %v, want [3 4]", seen)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if evs, last := collect(t, s, 4, journal.EventFilter{}); len(evs) != 1 || last != 5 || evs[0].Type != "test.own" {
		t.Errorf("after commit: %+v, last %d; want test.own at 5", evs, last)
	}

	for _, bad := range []journal.Event{
		{},
		{Type: "x.y", GroupID: "node_wrongkind"},
		{Type: "x.y", TraceID: "short"},
		{Type: "x.y", Data: json.RawMessage("{")},
	} {
		err := s.Update(context.Background(), func(tx journal.Tx) error {
			return tx.AppendEvent(bad)
		})
		if !errors.Is(err, journal.ErrInvalidArgument) {
			t.Errorf("append %+v: %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func testEventsGapless(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	appendEvents(t, s, journal.Event{Type: "test.a"})
	_ = s.Update(context.Background(), func(tx journal.Tx) error {
		if err := tx.AppendEvent(journal.Event{Type: "test.lost"}); err != nil {
			return err
		}
		return errSentinel
	})
	seqs := appendEvents(t, s, journal.Event{Type: "test.b"})
	if seqs[0] != 2 {
		t.Fatalf("seq after an aborted append = %d, want 2 (no gap)", seqs[0])
	}
	evs, _ := collect(t, s, 0, journal.EventFilter{})
	if len(evs) != 2 || evs[1].Type != "test.b" {
		t.Fatalf("log = %+v", evs)
	}
}

func testFollow(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	appendEvents(t, s, journal.Event{Type: "test.before"})
	start, err := journal.LastSeq(context.Background(), s)
	if err != nil || start != 1 {
		t.Fatalf("LastSeq = %d, %v", start, err)
	}

	// A Notify channel taken before a commit with events closes on it.
	ch := s.Notify()
	select {
	case <-ch:
		t.Fatal("Notify closed before any commit")
	default:
	}
	appendEvents(t, s, journal.Event{Type: "test.wake"})
	<-ch // blocks forever (test timeout) if the commit did not notify

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan journal.Event)
	done := make(chan error, 1)
	go func() {
		done <- journal.Follow(ctx, s, 0, journal.EventFilter{Types: []string{"test.*"}}, func(ev journal.Event) error {
			select {
			case got <- ev:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	// History first, then live events from several writers, in seq order.
	for want := uint64(1); want <= 2; want++ {
		if ev := <-got; ev.Seq != want {
			t.Fatalf("follow history: seq %d, want %d", ev.Seq, want)
		}
	}
	const writers, each = 4, 5
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := s.Update(context.Background(), func(tx journal.Tx) error {
					return tx.AppendEvent(journal.Event{Type: "test.live"})
				}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	for want := uint64(3); want <= 2+writers*each; want++ {
		if ev := <-got; ev.Seq != want || ev.Type != "test.live" {
			t.Fatalf("follow live: got seq %d type %s, want seq %d", ev.Seq, ev.Type, want)
		}
	}
	wg.Wait()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Follow after cancel returned %v, want context.Canceled", err)
	}
}

func testEventsPaging(t *testing.T, open func(*testing.T, Options) journal.Store) {
	s := open(t, Options{})
	// More than one internal page, and a filter that matches rarely, so
	// pages with no matches must still advance.
	const total = 700
	if err := s.Update(context.Background(), func(tx journal.Tx) error {
		for i := range total {
			typ := "test.noise"
			if i%100 == 99 {
				typ = "test.signal"
			}
			if err := tx.AppendEvent(journal.Event{Type: typ}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	all, last := collect(t, s, 0, journal.EventFilter{})
	if len(all) != total || last != total {
		t.Fatalf("read %d events, last %d; want %d", len(all), last, total)
	}
	for i, ev := range all {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
	sig, last := collect(t, s, 0, journal.EventFilter{Types: []string{"test.signal"}})
	if len(sig) != total/100 || last != total {
		t.Fatalf("filtered: %d events, last %d", len(sig), last)
	}
}
