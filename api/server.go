package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/randid"
)

// ServerOptions configures NewServer.
type ServerOptions struct {
	// Logger receives one line per request and the failures. Default: discard.
	Logger *slog.Logger
	// Observe, if set, receives every request's operation (the route
	// pattern), result code ("" for success) and latency, for metrics.
	Observe func(op, code string, d time.Duration)
	// Forward, if set, forwards calls on attempts other workers own to
	// them (forward.go).
	Forward *ForwardOptions
}

// Server is the HTTP/JSON face of a Fabric. It translates, and does nothing
// else: decoding and validating requests, calling one Fabric method,
// encoding the result or the error.
type Server struct {
	f       *fabric.Fabric
	log     *slog.Logger
	observe func(op, code string, d time.Duration)
	mux     *http.ServeMux
	// active counts handlers running, so that Serve can return only once
	// none is left touching the Fabric.
	active atomic.Int64
	// stopping is closed when Serve begins to shut down: streams that never
	// end by themselves (events?follow=1) end then, so that shutdown does
	// not wait a whole grace period for them.
	stopping chan struct{}
	stopOnce sync.Once
	fwd      *ForwardOptions
	// patterns are the mux patterns registered, in order (the test that
	// holds docs/openapi.yaml to them reads it).
	patterns []string
}

// NewServer returns the handler of every /v1/ endpoint of f.
func NewServer(f *fabric.Fabric, opts ServerOptions) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{f: f, log: opts.Logger, observe: opts.Observe, mux: http.NewServeMux(), stopping: make(chan struct{}),
		fwd: opts.Forward}
	s.handle("GET /v1/status", false, s.status)
	s.handle("GET /v1/workers", false, s.workers)
	s.handle("POST /v1/import", true, s.importContent)
	s.handle("POST /v1/export", true, s.exportDir)
	s.handle("GET /v1/export/{file}", false, s.exportTar)
	s.handle("POST /v1/fsck", true, s.fsck)
	s.routeGraph()
	s.routeAttempts()
	s.routeOps()
	s.handle("GET /v1/events", false, s.events)
	// Everything else, including a known path with the wrong method, is a
	// JSON not_found rather than the mux's plain-text reply.
	s.handle("/", false, func(w http.ResponseWriter, r *http.Request) error {
		return fmt.Errorf("no endpoint %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound)
	})
	return s
}

// ServeHTTP implements http.Handler. A request that came through a network
// listener with tokens is authenticated first (auth.go).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.authenticate(w, r) {
		return
	}
	if s.forward(w, r) {
		return
	}
	s.mux.ServeHTTP(w, r)
}

// handlerFunc handles one request. It returns an error only when it has not
// written a response yet (the wrapper writes the error) or when a stream
// failed after it started (the handler has reported it in the stream).
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// handle registers h under pattern behind the common request plumbing:
// call info (idempotency key, trace context) into the context, errors
// through the status table, one log line per request.
func (s *Server) handle(pattern string, mutating bool, h handlerFunc) {
	s.patterns = append(s.patterns, pattern)
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		defer s.active.Add(-1)
		start := time.Now()
		rec := &recorder{ResponseWriter: w}
		tc := parseTraceparent(r.Header.Get(v1.HeaderTraceparent))
		rec.Header().Set(v1.HeaderTraceparent, tc.String())
		ci := fabric.CallInfo{TraceID: tc.TraceID, SpanID: tc.SpanID}

		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					if p == http.ErrAbortHandler {
						panic(p)
					}
					err = fmt.Errorf("handler panic: %v", p)
				}
			}()
			key, err := parseIdempotencyKey(r.Header.Values(v1.HeaderIdempotencyKey))
			if err != nil {
				return err
			}
			generated, err := parseKeyGenerated(r.Header.Values(v1.HeaderKeyGenerated), key)
			if err != nil {
				return err
			}
			if mutating {
				// Every mutation has a key: the caller's, or one made here
				// and returned, so that even a caller that sent none can
				// retry a reply it lost.
				ci.KeyGenerated = generated
				if key == "" {
					key, ci.KeyGenerated = "api-"+randid.Hex(16), true
				}
				ci.IdempotencyKey = key
				rec.Header().Set(v1.HeaderIdempotencyKey, key)
			}
			r = r.WithContext(fabric.WithCallInfo(r.Context(), ci))
			return h(rec, r)
		}()

		code := errdefs.Code("")
		if err != nil {
			code = errdefs.CodeOf(err)
			if !rec.wrote {
				writeError(rec, err)
			}
		}
		if s.observe != nil {
			s.observe(pattern, string(code), time.Since(start))
		}
		level, msg := slog.LevelInfo, "request"
		switch code {
		case "":
		case errdefs.CodeInternal, errdefs.CodeCorrupt:
			level, msg = slog.LevelError, "request failed"
		default:
			msg = "request failed"
		}
		// Nothing is built for a log that drops the record (issue 21: a
		// logger With these attributes per request, for nothing).
		if !s.log.Enabled(r.Context(), level) {
			return
		}
		attrs := []any{"trace_id", tc.TraceID, "method", r.Method, "path", r.URL.Path,
			"status", rec.statusCode(), "ms", millis(time.Since(start))}
		if ci.IdempotencyKey != "" {
			attrs = append(attrs, "idempotency_key", ci.IdempotencyKey)
		}
		if code != "" {
			attrs = append(attrs, "code", code, "err", err)
		}
		s.log.Log(r.Context(), level, msg, attrs...)
	})
}

// recorder remembers whether and with which status a response was started.
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wrote {
		r.status, r.wrote = http.StatusOK, true
	}
	return r.ResponseWriter.Write(b)
}

func (r *recorder) statusCode() int {
	if !r.wrote {
		return http.StatusOK
	}
	return r.status
}

// Unwrap lets http.ResponseController reach Flush on the real writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", v1.MediaJSON)
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // a write error means the client left; nothing to tell it
}

func writeError(w http.ResponseWriter, err error) {
	status, body := errorBody(err)
	writeJSON(w, status, body)
}

// maxIdempotencyKey bounds the key: it is stored with the result of the
// mutation it names.
const maxIdempotencyKey = 255

// parseKeyGenerated reads v1.HeaderKeyGenerated: absent, or "true" with a key.
func parseKeyGenerated(vals []string, key string) (bool, error) {
	switch {
	case len(vals) == 0:
		return false, nil
	case len(vals) == 1 && vals[0] == "true" && key != "":
		return true, nil
	case len(vals) == 1 && vals[0] == "true":
		return false, fmt.Errorf("%s without %s: %w", v1.HeaderKeyGenerated, v1.HeaderIdempotencyKey, errdefs.ErrInvalidArgument)
	}
	return false, fmt.Errorf("%s: want a single \"true\", got %q: %w", v1.HeaderKeyGenerated, vals, errdefs.ErrInvalidArgument)
}

func parseIdempotencyKey(vals []string) (string, error) {
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("%s given %d times: %w", v1.HeaderIdempotencyKey, len(vals), errdefs.ErrInvalidArgument)
	}
	k := vals[0]
	if k == "" || len(k) > maxIdempotencyKey {
		return "", fmt.Errorf("%s: want 1 to %d characters: %w", v1.HeaderIdempotencyKey, maxIdempotencyKey, errdefs.ErrInvalidArgument)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "", fmt.Errorf("%s: want visible ASCII characters only: %w", v1.HeaderIdempotencyKey, errdefs.ErrInvalidArgument)
		}
	}
	return k, nil
}

// hostPath checks a path the daemon is asked to read or write on its own
// host: absolute, so it never depends on the daemon's working directory.
func hostPath(field, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%s: empty path: %w", field, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%s %q: want an absolute path on the daemon's host: %w", field, p, errdefs.ErrInvalidArgument)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("%s: path contains NUL: %w", field, errdefs.ErrInvalidArgument)
	}
	return filepath.Clean(p), nil
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) error {
	st, err := s.f.Status(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v1.StatusResponse{
		Version:  st.Version,
		StateDir: st.StateDir,
		Objects:  st.Objects,
		Bytes:    st.Bytes,
		Remote:   ptr(st.Remote, remoteStatus),
	})
	return nil
}

func (s *Server) workers(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.f.Workers(r.Context())
	if err != nil {
		return err
	}
	out := v1.WorkersResponse{Workers: make([]v1.Worker, 0, len(ws)), Fenced: s.f.Fenced()}
	for _, x := range ws {
		out.Workers = append(out.Workers, v1.Worker{ID: x.ID, Addr: x.Addr, Capacity: x.Capacity, Live: x.Live,
			Started: x.Started, TTLMS: x.TTLSeconds * 1000, Self: x.ID == s.f.WorkerID()})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// decodeImport reads the JSON form of an import request.
func decodeImport(r *http.Request) (v1.ImportRequest, error) {
	req, err := decodeJSON[v1.ImportRequest](r.Body)
	if err != nil {
		return req, err
	}
	req.Source, err = hostPath("source", req.Source)
	return req, err
}

func (s *Server) importContent(w http.ResponseWriter, r *http.Request) error {
	var src fabric.ImportSource
	switch mt := wire.MediaType(r.Header.Get("Content-Type")); {
	case mt == v1.MediaJSON || mt == "":
		req, err := decodeImport(r)
		if err != nil {
			return err
		}
		src.Path = req.Source
	case tarMediaTypes[mt]:
		src.Tar = r.Body
	default:
		return fmt.Errorf("import: Content-Type %q: want %s or %s: %w", mt, v1.MediaJSON, v1.MediaTar, errdefs.ErrInvalidArgument)
	}
	res, err := s.f.Import(r.Context(), src)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, importResponse(res))
	return nil
}

func decodeExport(r *http.Request) (v1.ExportRequest, error) {
	req, err := decodeJSON[v1.ExportRequest](r.Body)
	if err != nil {
		return req, err
	}
	if req.ID == "" {
		return req, fmt.Errorf("id: empty: %w", errdefs.ErrInvalidArgument)
	}
	req.To, err = hostPath("to", req.To)
	return req, err
}

func (s *Server) exportDir(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeExport(r)
	if err != nil {
		return err
	}
	root, st, err := s.f.ExportDir(r.Context(), req.ID, req.To, fabric.ExportOptions{PreservePrivileged: req.PreservePrivileged})
	if err != nil {
		return err
	}
	if st.Dropped.Paths == nil {
		st.Dropped.Paths = []string{}
	}
	writeJSON(w, http.StatusOK, v1.ExportResponse{
		RootID:   idView(root),
		To:       req.To,
		Files:    st.Files,
		Dirs:     st.Dirs,
		Symlinks: st.Symlinks,
		Others:   st.Others,
		Links:    st.Links,
		Bytes:    st.Bytes,
		Skipped:  st.Skipped,
		Dropped:  droppedView(st.Dropped),
	})
	return nil
}

// exportTar streams the tree of {id}.tar. Errors found before the first
// byte are ordinary JSON errors. After it, the status line is gone: the
// stream ends early and the trailers say so (v1.TrailerStatus "error" and
// v1.TrailerError), so a client never takes a truncated tar as complete. The
// tar itself then also lacks its end-of-archive blocks.
func (s *Server) exportTar(w http.ResponseWriter, r *http.Request) error {
	file := r.PathValue("file")
	id, ok := strings.CutSuffix(file, ".tar")
	if !ok {
		return fmt.Errorf("export %q: want <id>.tar: %w", file, errdefs.ErrInvalidArgument)
	}
	var opts fabric.ExportOptions
	switch v := r.URL.Query().Get(v1.QueryPreservePrivileged); v {
	case "", "false":
	case "true":
		opts.PreservePrivileged = true
	default:
		return fmt.Errorf("export: %s=%q: want true or false: %w", v1.QueryPreservePrivileged, v, errdefs.ErrInvalidArgument)
	}
	ctx := r.Context()
	root, err := s.f.ResolveRoot(ctx, id)
	if err != nil {
		return err
	}
	tw := &lazyStream{w: w, start: func(h http.Header) {
		h.Set("Content-Type", v1.MediaTar)
		h.Set(v1.HeaderRootID, root.String())
		h.Set("Trailer", v1.TrailerStatus+", "+v1.TrailerError+", "+v1.TrailerDropped)
	}}
	_, st, err := s.f.ExportTar(ctx, root.String(), tw, opts)
	if err != nil && !tw.started {
		return err
	}
	tw.begin()
	if err != nil {
		w.Header().Set(v1.TrailerStatus, "error")
		w.Header().Set(v1.TrailerError, asciiJSON(errdefs.Wire(err)))
		return err
	}
	if st.Dropped.Paths == nil {
		st.Dropped.Paths = []string{}
	}
	w.Header().Set(v1.TrailerDropped, asciiJSON(st.Dropped))
	w.Header().Set(v1.TrailerStatus, "ok")
	return nil
}

// lazyStream starts a streamed response on its first byte, so that a
// failure before it can still be a JSON error with its own status.
type lazyStream struct {
	w       http.ResponseWriter
	start   func(http.Header)
	started bool
}

func (l *lazyStream) begin() {
	if !l.started {
		l.started = true
		l.start(l.w.Header())
		l.w.WriteHeader(http.StatusOK)
	}
}

func (l *lazyStream) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	l.begin()
	return l.w.Write(p)
}

// asciiJSON encodes v as JSON with every non-ASCII character escaped, so it
// is a valid header value whatever the message holds.
func asciiJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return `{"code":"internal","message":"unencodable error"}`
	}
	var sb strings.Builder
	for _, c := range string(b) {
		switch {
		case c == 0x7f:
			sb.WriteString(`\u007f`)
		case c < 0x80:
			sb.WriteRune(c)
		case c <= 0xffff:
			fmt.Fprintf(&sb, `\u%04x`, c)
		default:
			c -= 0x10000
			fmt.Fprintf(&sb, `\u%04x\u%04x`, 0xd800+(c>>10), 0xdc00+(c&0x3ff))
		}
	}
	return sb.String()
}

func decodeFsck(r *http.Request) (v1.FsckRequest, error) {
	if r.ContentLength == 0 {
		return v1.FsckRequest{}, nil
	}
	return decodeJSON[v1.FsckRequest](r.Body)
}

func (s *Server) fsck(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeFsck(r)
	if err != nil {
		return err
	}
	if req.Remote {
		res, err := s.f.FsckRemote(r.Context())
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, v1.FsckResponse{Checked: res.Checked, Bytes: res.Bytes, Bad: idList(res.Bad),
			Missing: each(res.Missing, idView)})
		return nil
	}
	res, err := s.f.Fsck(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v1.FsckResponse{Checked: res.Checked, Bytes: res.Bytes, Vanished: res.Vanished, Bad: idList(res.Bad)})
	return nil
}

// Serve serves s on ln until ctx is done, then shuts down gracefully: it
// stops accepting, lets in-flight requests finish for up to grace, then
// closes what is left (their contexts are cancelled). It returns once every
// connection is closed; it closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	return s.ServeAll(ctx, grace, ln)
}

// ServeAll is Serve on several listeners at once (the unix socket and a
// network listener from ListenTCP), shut down together.
func (s *Server) ServeAll(ctx context.Context, grace time.Duration, lns ...net.Listener) error {
	// Requests do not inherit ctx: a signal must let them finish, not
	// cancel them. base is cancelled only when the grace period is over.
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return base },
		ConnContext:       connContext,
	}
	errc := make(chan error, len(lns))
	for _, ln := range lns {
		go func() { errc <- hs.Serve(ln) }()
	}
	var err error
	received := 0
	select {
	case serr := <-errc:
		// A listener failed: stop the others too.
		received++
		err = fmt.Errorf("serve: %w", serr)
		hs.Close()
	case <-ctx.Done():
		err = s.shutdown(hs, grace, cancelBase)
	}
	for ; received < len(lns); received++ {
		if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
	}
	return err
}

// shutdown stops hs gracefully within grace, then forcibly.
func (s *Server) shutdown(hs *http.Server, grace time.Duration, cancelBase context.CancelFunc) error {
	s.log.Info("shutting down", "grace", grace.String())
	s.stopOnce.Do(func() { close(s.stopping) })
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if err != nil {
		s.log.Warn("grace period over, cancelling the remaining requests", "err", err)
		cancelBase()
		err = hs.Close()
		// Close does not wait for handlers; they stop on their cancelled
		// contexts. Give them a moment so none outlives Serve.
		deadline := time.Now().Add(handlerStopWait)
		for s.active.Load() > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := s.active.Load(); n > 0 && err == nil {
			err = fmt.Errorf("shutdown: %d requests still running %v after cancellation", n, handlerStopWait)
		}
	}
	return err
}

// handlerStopWait bounds how long Serve waits for cancelled handlers.
const handlerStopWait = 5 * time.Second

// millis is a duration for logs: milliseconds with microsecond precision.
func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
