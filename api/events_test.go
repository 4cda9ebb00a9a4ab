package api

import (
	"context"
	"errors"
	"net/url"
	"reflect"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/journal"
)

func collectEvents(t *testing.T, h *harness, q v1.EventsQuery) []journal.Event {
	t.Helper()
	var evs []journal.Event
	if err := h.client.Events(context.Background(), q, func(ev v1.Event) error {
		evs = append(evs, journal.Event(ev))
		return nil
	}); err != nil {
		t.Fatalf("events %+v: %v", q, err)
	}
	return evs
}

func TestEventsListAndFilter(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	ctx := context.Background()
	src := newSource(t, map[string]string{"f": "x"})
	var groups []string
	for range 2 {
		g, err := h.client.CreateGroup(ctx, v1.CreateGroupRequest{Source: src}, client.CallOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.client.Fork(ctx, v1.ForkRequest{NodeID: g.Node.NodeID, N: 2}, client.CallOptions{IdempotencyKey: "fork-" + g.Group.GroupID}); err != nil {
			t.Fatal(err)
		}
		groups = append(groups, g.Group.GroupID)
	}
	all := collectEvents(t, h, v1.EventsQuery{})
	// group.created, node.created, 2 x node.forked, per group.
	if len(all) != 8 {
		t.Fatalf("%d events, want 8: %+v", len(all), all)
	}
	for i, ev := range all {
		if ev.Seq != uint64(i+1) || ev.TraceID == "" || ev.IdempotencyKey == "" {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	one := collectEvents(t, h, v1.EventsQuery{GroupID: groups[1]})
	if len(one) != 4 || one[0].GroupID != groups[1] || one[3].IdempotencyKey != "fork-"+groups[1] {
		t.Fatalf("group filter: %+v", one)
	}
	forks := collectEvents(t, h, v1.EventsQuery{Types: []string{"node.forked"}, After: 4})
	if len(forks) != 2 || forks[0].Seq != 7 {
		t.Fatalf("type filter after 4: %+v", forks)
	}
	prefix := collectEvents(t, h, v1.EventsQuery{Types: []string{"group.*", "node.created"}})
	if len(prefix) != 4 || prefix[0].Type != journal.EventGroupCreated || prefix[1].Type != journal.EventNodeCreated {
		t.Fatalf("type prefix filter: %+v", prefix)
	}
	if got := collectEvents(t, h, v1.EventsQuery{After: 8}); len(got) != 0 {
		t.Fatalf("after the last event: %+v", got)
	}
}

func TestEventsQueryRoundTrip(t *testing.T) {
	q := v1.EventsQuery{After: 12, GroupID: "grp_1", NodeID: "node_2", AttemptID: "att_3", Types: []string{"a.b", "c.*"}, Follow: true}
	got, err := parseEventsQuery(q.Values())
	if err != nil || !reflect.DeepEqual(got, q) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	comma, err := parseEventsQuery(url.Values{"type": {"a.b,c.*"}})
	if err != nil || !reflect.DeepEqual(comma.Types, q.Types) {
		t.Fatalf("comma-separated types: %+v, %v", comma, err)
	}
	for _, bad := range []url.Values{
		{"follow": {"maybe"}}, {"type": {""}}, {"node": {"grp_1"}}, {"x": {"1"}}, {"after": {"1", "2"}},
	} {
		if _, err := parseEventsQuery(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

// follow runs a follow stream in the background and hands its events over
// a channel; the returned channel gets the stream's end.
func follow(h *harness, ctx context.Context, q v1.EventsQuery) (<-chan journal.Event, <-chan error) {
	evs := make(chan journal.Event, 64)
	done := make(chan error, 1)
	q.Follow = true
	go func() {
		done <- h.client.Events(ctx, q, func(ev v1.Event) error {
			evs <- journal.Event(ev)
			return nil
		})
	}()
	return evs, done
}

func nextEvent(t *testing.T, evs <-chan journal.Event) journal.Event {
	t.Helper()
	select {
	case ev := <-evs:
		return ev
	case <-time.After(time.Minute):
		t.Fatal("no event in a minute")
	}
	return journal.Event{}
}

// TestEventsFollow: a follower gets the log so far, then new events as
// they commit; when it goes away the handler ends.
func TestEventsFollow(t *testing.T) {
	h := newHarness(t, 5*time.Second)
	bg := context.Background()
	src := newSource(t, map[string]string{"f": "x"})
	g, err := h.client.CreateGroup(bg, v1.CreateGroupRequest{Source: src}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	evs, done := follow(h, ctx, v1.EventsQuery{GroupID: g.Group.GroupID})
	if ev := nextEvent(t, evs); ev.Type != journal.EventGroupCreated {
		t.Fatalf("first event %+v", ev)
	}
	if ev := nextEvent(t, evs); ev.Type != journal.EventNodeCreated {
		t.Fatalf("second event %+v", ev)
	}
	f, err := h.client.Fork(bg, v1.ForkRequest{NodeID: g.Node.NodeID}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, evs); ev.Type != journal.EventNodeForked || ev.NodeID != f.Nodes[0].NodeID {
		t.Fatalf("followed event %+v", ev)
	}
	// Another group's events do not reach this follower.
	if _, err := h.client.CreateGroup(bg, v1.CreateGroupRequest{Source: src}, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-evs:
		t.Fatalf("event of another group: %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrUnavailable) && errdefs.CodeOf(err) != errdefs.CodeDeadlineExceeded {
			t.Fatalf("follow after cancel: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("follow did not end on cancel")
	}
	// The handler notices the client left and ends.
	waitFor(t, func() bool { return h.srv.active.Load() == 0 })
}

// TestEventsFollowEndsOnShutdown: a follower does not hold shutdown for the
// grace period; it is told the daemon went away (unavailable).
func TestEventsFollowEndsOnShutdown(t *testing.T) {
	// A grace period far longer than a loaded machine needs to shut
	// down: a Serve that waits it out is the failure.
	h := newHarness(t, 5*time.Minute)
	_, done := follow(h, context.Background(), v1.EventsQuery{})
	waitFor(t, func() bool { return h.srv.active.Load() == 1 })
	start := time.Now()
	h.stop()
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
		h.done <- nil
	case <-time.After(2 * time.Minute):
		t.Fatalf("Serve waited for a follower: %v after the shutdown began", time.Since(start))
	}
	if err := <-done; !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("follower at shutdown: %v, want unavailable", err)
	}
}

// FuzzEventsQuery: any query string either fails as invalid_argument or
// parses to a query that survives Values and a second parse unchanged.
func FuzzEventsQuery(f *testing.F) {
	for _, s := range []string{"", "after=3&group=grp_1", "type=a.*,b.c&type=d&follow=1", "follow=true&node=node_x",
		"after=18446744073709551616", "type=,", "x=1", "attempt=att_%00", "after=1&after=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		q, err := parseEventsQuery(v)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("%q: rejection is not invalid_argument: %v", raw, err)
			}
			return
		}
		q2, err := parseEventsQuery(q.Values())
		if err != nil || !reflect.DeepEqual(q, q2) {
			t.Fatalf("%q: %+v re-parses to %+v, %v", raw, q, q2, err)
		}
	})
}
