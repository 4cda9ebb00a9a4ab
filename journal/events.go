package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Event is one entry of the append-only log: a transition, correlated with
// the ids the spec's trace audit asks for. Events are written by
// Tx.AppendEvent in the same batch as the transition they describe, so the
// log never shows a transition that did not commit, nor misses one that did.
type Event struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Type is "<record>.<what>", e.g. "node.forked", "attempt.state".
	Type      string `json:"type"`
	GroupID   string `json:"group_id,omitempty"`
	NodeID    string `json:"node_id,omitempty"`
	AttemptID string `json:"attempt_id,omitempty"`
	RootID    string `json:"root_id,omitempty"`
	LeaseID   string `json:"lease_id,omitempty"`
	// TraceID and SpanID are the W3C trace context of the operation (32
	// and 16 hex digits); ParentSpanID is the caller's span, if any.
	TraceID        string          `json:"trace_id,omitempty"`
	SpanID         string          `json:"span_id,omitempty"`
	ParentSpanID   string          `json:"parent_span_id,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Data           json.RawMessage `json:"data,omitempty"`
}

// The event types the journal's records go through. Operations may add
// their own under the same "<record>.<what>" scheme.
const (
	EventGroupCreated      = "group.created"
	EventGroupPromoted     = "group.promoted"
	EventNodeCreated       = "node.created" // a group's root node
	EventNodeForked        = "node.forked"
	EventNodeState         = "node.state" // data: {"from": ..., "to": ...}
	EventNodeBackprop      = "node.backprop"
	EventAttemptCreated    = "attempt.created"
	EventAttemptState      = "attempt.state" // data: {"from": ..., "to": ...}
	EventEvaluationCreated = "evaluation.created"
	EventLeaseAcquired     = "lease.acquired"
	EventLeaseRenewed      = "lease.renewed"
	EventLeaseExpired      = "lease.expired"
	EventLeaseReleased     = "lease.released"
)

// Validate checks the fields a store requires before appending ev; a
// violation wraps ErrInvalidArgument.
func (ev *Event) Validate() error {
	if ev.ok() {
		return nil
	}
	return ev.explain()
}

// explain is Validate's error: which field is wrong (see valid.go).
func (ev *Event) explain() error {
	return firstErr(
		checkName(ev.Type, "event type"),
		checkOptID(KindGroup, ev.GroupID),
		checkOptID(KindNode, ev.NodeID),
		checkOptID(KindAttempt, ev.AttemptID),
		checkOptID(KindLease, ev.LeaseID),
		checkOptHex(ev.RootID, 64, "event root_id"),
		checkOptHex(ev.TraceID, 32, "event trace_id"),
		checkOptHex(ev.SpanID, 16, "event span_id"),
		checkOptHex(ev.ParentSpanID, 16, "event parent_span_id"),
		checkText(ev.IdempotencyKey, "event idempotency key"),
		checkJSON(ev.Data, "event data"),
	)
}

func checkOptHex(s string, n int, what string) error {
	ok := s == "" || len(s) == n
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = '0' <= c && c <= '9' || 'a' <= c && c <= 'f'
	}
	return check(ok, "%s %q: want %d lowercase hex digits", what, s, n)
}

// Event returns an event of type typ carrying g's ids.
func (g *Group) Event(typ string) Event {
	return Event{Type: typ, GroupID: g.GroupID, NodeID: g.CanonicalNodeID}
}

// Event returns an event of type typ carrying n's ids.
func (n *Node) Event(typ string) Event {
	return Event{Type: typ, GroupID: n.GroupID, NodeID: n.NodeID, RootID: n.RootID}
}

// Event returns an event of type typ carrying a's ids.
func (a *Attempt) Event(typ string) Event {
	return Event{Type: typ, GroupID: a.GroupID, NodeID: a.NodeID, AttemptID: a.AttemptID, LeaseID: a.LeaseID}
}

// Event returns an event of type typ carrying e's ids.
func (e *Evaluation) Event(typ string) Event {
	return Event{Type: typ, GroupID: e.GroupID, NodeID: e.NodeID, AttemptID: e.AttemptID}
}

// Event returns an event of type typ carrying l's ids.
func (l *Lease) Event(typ string) Event {
	return Event{Type: typ, GroupID: l.GroupID, NodeID: l.NodeID, AttemptID: l.AttemptID, LeaseID: l.LeaseID}
}

// EventFilter selects events; a zero field matches everything.
type EventFilter struct {
	GroupID   string
	NodeID    string
	AttemptID string
	// Types are exact types, or "record.*" for every type of a record.
	Types []string
}

// Match reports whether ev passes f.
func (f *EventFilter) Match(ev *Event) bool {
	if f.GroupID != "" && ev.GroupID != f.GroupID ||
		f.NodeID != "" && ev.NodeID != f.NodeID ||
		f.AttemptID != "" && ev.AttemptID != f.AttemptID {
		return false
	}
	if len(f.Types) == 0 {
		return true
	}
	for _, t := range f.Types {
		if p, ok := strings.CutSuffix(t, "*"); ok && strings.HasPrefix(ev.Type, p) || t == ev.Type {
			return true
		}
	}
	return false
}

// eventPage bounds how many events one snapshot reads, so a slow consumer
// never pins a store snapshot (and pebble's obsolete data) for long.
const eventPage = 256

// Events calls fn, on the caller's goroutine and outside any transaction,
// for every committed event with Seq > after that f matches, in Seq order.
// It returns the position to continue from: the Seq of the last event that
// was delivered or filtered out (after if none). An error from fn stops the
// walk and is returned with the position before that event; ErrStop ends it
// with nil, counting the event it was returned for as delivered.
func Events(ctx context.Context, s Store, after uint64, f EventFilter, fn func(Event) error) (last uint64, err error) {
	last = after
	for {
		var page []Event
		var end uint64 // Seq of the last event this page read
		n := 0
		err := s.View(ctx, func(r Reader) error {
			page, end, n = page[:0], last, 0
			return r.Events(last, func(ev Event) error {
				n++
				end = ev.Seq
				if f.Match(&ev) {
					page = append(page, ev)
				}
				if n == eventPage {
					return ErrStop
				}
				return nil
			})
		})
		if err != nil {
			return last, err
		}
		for _, ev := range page {
			if err := ctx.Err(); err != nil {
				return last, err
			}
			if err := fn(ev); err != nil {
				if errors.Is(err, ErrStop) {
					return ev.Seq, nil
				}
				return last, err
			}
			last = ev.Seq
		}
		last = end
		if n < eventPage {
			return last, nil
		}
	}
}

// Follow is Events that does not end: after the events already committed it
// waits (without polling) for new ones and delivers them as they commit,
// until ctx ends (it returns ctx.Err()), fn fails, or the store closes
// (ErrClosed). Each event is delivered once, in Seq order.
func Follow(ctx context.Context, s Store, after uint64, f EventFilter, fn func(Event) error) error {
	for {
		ch := s.Notify()
		last, err := Events(ctx, s, after, f, fn)
		if err != nil {
			return err
		}
		after = last
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// LastSeq returns the Seq of the newest committed event, so a follower can
// start "from now".
func LastSeq(ctx context.Context, s Store) (uint64, error) {
	var seq uint64
	err := s.View(ctx, func(r Reader) error {
		var err error
		seq, err = r.LastSeq()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("last event seq: %w", err)
	}
	return seq, nil
}
