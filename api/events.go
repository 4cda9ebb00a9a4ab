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

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/journal"
)

// parseEventsQuery reads the query string strictly: an unknown or repeated
// parameter is invalid_argument, as an unknown JSON field is elsewhere.
func parseEventsQuery(v url.Values) (v1.EventsQuery, error) {
	var q v1.EventsQuery
	bad := func(format string, args ...any) (v1.EventsQuery, error) {
		return v1.EventsQuery{}, fmt.Errorf("events: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
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
				return v1.EventsQuery{}, fmt.Errorf("events: %s: %w", name, err)
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
	h.Set("Content-Type", v1.MediaNDJSON)
	h.Set("Cache-Control", "no-store")
	h.Set("Trailer", v1.TrailerStatus+", "+v1.TrailerError)
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
		h.Set(v1.TrailerStatus, "ok")
		return nil
	case r.Context().Err() != nil:
		// The client left; nobody reads the trailers.
		return nil
	}
	h.Set(v1.TrailerStatus, "error")
	h.Set(v1.TrailerError, asciiJSON(errdefs.Wire(err)))
	return err
}
