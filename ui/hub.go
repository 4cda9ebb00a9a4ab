package ui

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
)

// hub follows esfd's event log once for every page: it keeps what the
// groups view needs that no read endpoint gives (the list of groups and
// the live attempts of each) and fans new events out to the pages'
// event streams.
type hub struct {
	c *client.Client

	ready chan struct{} // closed once the log has been read to its end

	mu       sync.Mutex
	seq      uint64
	groups   []string // in creation order
	known    map[string]bool
	attempts map[string]attemptInfo
	subs     map[chan v1.Event]struct{}
	lastErr  string
}

type attemptInfo struct {
	group, node string
	state       v1.AttemptState
}

// subBuffer is how many events a page may fall behind before its stream
// is closed (the page then reconnects and reloads what it shows).
const subBuffer = 1024

func newHub(c *client.Client) *hub {
	return &hub{c: c, ready: make(chan struct{}), known: map[string]bool{},
		attempts: map[string]attemptInfo{}, subs: map[chan v1.Event]struct{}{}}
}

// run reads the log to its end, then follows it until ctx ends,
// reconnecting (from the last seq seen) when the stream breaks.
func (h *hub) run(ctx context.Context) {
	for ctx.Err() == nil {
		h.mu.Lock()
		after := h.seq
		h.mu.Unlock()
		err := h.c.Events(ctx, v1.EventsQuery{After: after}, func(ev v1.Event) error { h.apply(ev, false); return nil })
		if err == nil {
			break
		}
		h.failed(ctx, err)
	}
	close(h.ready)
	for ctx.Err() == nil {
		h.mu.Lock()
		after := h.seq
		h.mu.Unlock()
		err := h.c.Events(ctx, v1.EventsQuery{After: after, Follow: true}, func(ev v1.Event) error { h.apply(ev, true); return nil })
		if ctx.Err() != nil {
			break
		}
		h.failed(ctx, err)
	}
	h.mu.Lock()
	for ch := range h.subs {
		close(ch)
		delete(h.subs, ch)
	}
	h.mu.Unlock()
}

// failed records err and waits a second before the next try.
func (h *hub) failed(ctx context.Context, err error) {
	h.mu.Lock()
	if err != nil {
		h.lastErr = err.Error()
	}
	h.mu.Unlock()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (h *hub) apply(ev v1.Event, publish bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ev.Seq <= h.seq {
		return // a reconnect's overlap
	}
	h.seq = ev.Seq
	h.lastErr = ""
	if ev.GroupID != "" && !h.known[ev.GroupID] && ev.Type == v1.EventGroupCreated {
		h.known[ev.GroupID] = true
		h.groups = append(h.groups, ev.GroupID)
	}
	switch ev.Type {
	case v1.EventAttemptCreated:
		h.attempts[ev.AttemptID] = attemptInfo{group: ev.GroupID, node: ev.NodeID, state: v1.AttemptQueued}
	case v1.EventAttemptState:
		var d struct {
			To v1.AttemptState `json:"to"`
		}
		if json.Unmarshal(ev.Data, &d) == nil && d.To != "" {
			a := h.attempts[ev.AttemptID]
			a.group, a.node, a.state = ev.GroupID, ev.NodeID, d.To
			if live(d.To) {
				h.attempts[ev.AttemptID] = a
			} else {
				delete(h.attempts, ev.AttemptID)
			}
		}
	}
	if !publish {
		return
	}
	for ch := range h.subs {
		select {
		case ch <- ev:
		default:
			close(ch) // too far behind: the page reconnects and reloads
			delete(h.subs, ch)
		}
	}
}

func live(s v1.AttemptState) bool {
	return s == v1.AttemptQueued || s == v1.AttemptActive || s == v1.AttemptQuiescing
}

// subscribe returns a channel of the events after the returned seq; it is
// closed when the subscriber falls behind or the hub stops. Call
// unsubscribe when done.
func (h *hub) subscribe() (chan v1.Event, uint64) {
	ch := make(chan v1.Event, subBuffer)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs[ch] = struct{}{}
	return ch, h.seq
}

func (h *hub) unsubscribe(ch chan v1.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[ch]; ok {
		delete(h.subs, ch)
		close(ch)
	}
}

// groupsSnapshot is the known groups, oldest first, and each one's live
// attempts.
func (h *hub) groupsSnapshot() ([]string, map[string]int, uint64, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	live := map[string]int{}
	for _, a := range h.attempts {
		live[a.group]++
	}
	return append([]string(nil), h.groups...), live, h.seq, h.lastErr
}
