package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/journal"
)

// EventsQuery selects events: GET /v1/events?after=N&group=G&node=N&
// attempt=A&type=T&follow=1. Zero fields select everything.
type EventsQuery struct {
	// After is the sequence number to continue from: only events with a
	// larger Seq are sent.
	After     uint64
	GroupID   string
	NodeID    string
	AttemptID string
	// Types are exact types ("node.forked") or "record.*" prefixes.
	Types []string
	// Follow keeps the stream open and sends events as they commit.
	Follow bool
}

// Values encodes q as the query string of GET /v1/events.
func (q EventsQuery) Values() url.Values {
	v := url.Values{}
	if q.After > 0 {
		v.Set("after", strconv.FormatUint(q.After, 10))
	}
	for k, s := range map[string]string{"group": q.GroupID, "node": q.NodeID, "attempt": q.AttemptID} {
		if s != "" {
			v.Set(k, s)
		}
	}
	for _, t := range q.Types {
		v.Add("type", t)
	}
	if q.Follow {
		v.Set("follow", "1")
	}
	return v
}

// parseEventsQuery reads the query string strictly: an unknown or repeated
// parameter is invalid_argument, as an unknown JSON field is elsewhere.
func parseEventsQuery(v url.Values) (EventsQuery, error) {
	var q EventsQuery
	bad := func(format string, args ...any) (EventsQuery, error) {
		return EventsQuery{}, fmt.Errorf("events: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
	}
	for name, vals := range v {
		if name != "type" && len(vals) != 1 {
			return bad("%s given %d times", name, len(vals))
		}
		val := vals[0]
		switch name {
		case "after":
			n, err := strconv.ParseUint(val, 10, 64)
			if err != nil {
				return bad("after=%q: want a sequence number", val)
			}
			q.After = n
		case "group", "node", "attempt":
			kind := map[string]journal.Kind{"group": journal.KindGroup, "node": journal.KindNode, "attempt": journal.KindAttempt}[name]
			if err := journal.CheckID(kind, val); err != nil {
				return EventsQuery{}, fmt.Errorf("events: %s: %w", name, err)
			}
			switch name {
			case "group":
				q.GroupID = val
			case "node":
				q.NodeID = val
			default:
				q.AttemptID = val
			}
		case "type":
			for _, s := range vals {
				for _, t := range strings.Split(s, ",") {
					if t == "" || len(t) > 256 {
						return bad("type %q: want a type like node.forked or node.*", t)
					}
					q.Types = append(q.Types, t)
				}
			}
		case "follow":
			b, err := strconv.ParseBool(val)
			if err != nil {
				return bad("follow=%q: want 1 or 0", val)
			}
			q.Follow = b
		default:
			return bad("unknown parameter %q (want after, group, node, attempt, type, follow)", name)
		}
	}
	return q, nil
}

// errShuttingDown ends follow streams when the daemon stops.
var errShuttingDown = fmt.Errorf("esfd is shutting down; resume with after=<last seq>: %w", errdefs.ErrUnavailable)

// events streams matching events as JSON lines (application/x-ndjson), one
// event per line, flushed as written. Errors before the stream starts are
// ordinary JSON errors; after it, the trailers say how it ended, as for
// tar exports: Esf-Status ok when every event asked for was sent (a listing
// reached the end of the log), error otherwise (then Esf-Error). A follow
// stream never completes: it ends when the client goes away, or with
// unavailable when the daemon shuts down, so the client resumes from the
// last Seq it saw.
func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	q, err := parseEventsQuery(r.URL.Query())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	if q.Follow {
		// Shutdown must not wait out its grace period for a follower. The
		// goroutine ends with the request at the latest (deferred cancel).
		go func() {
			select {
			case <-s.stopping:
				cancel(errShuttingDown)
			case <-ctx.Done():
			}
		}()
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", MediaNDJSON)
	h.Set("Cache-Control", "no-store")
	h.Set("Trailer", TrailerStatus+", "+TrailerError)
	w.WriteHeader(http.StatusOK)
	// A follower learns at once that the stream is established.
	_ = rc.Flush()

	filter := journal.EventFilter{GroupID: q.GroupID, NodeID: q.NodeID, AttemptID: q.AttemptID, Types: q.Types}
	err = s.f.Events(ctx, q.After, filter, q.Follow, func(ev journal.Event) error {
		line, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		line = append(line, '\n')
		if _, err := w.Write(line); err != nil {
			return err
		}
		return rc.Flush()
	})
	if cause := context.Cause(ctx); cause != nil && errors.Is(cause, errShuttingDown) {
		err = cause
	}
	switch {
	case err == nil:
		h.Set(TrailerStatus, "ok")
		return nil
	case r.Context().Err() != nil:
		// The client left; nobody reads the trailers.
		return nil
	}
	h.Set(TrailerStatus, "error")
	h.Set(TrailerError, asciiJSON(errdefs.Wire(err)))
	return err
}
