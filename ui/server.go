package ui

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

//go:embed assets
var assets embed.FS

// HeaderUI must be on every mutation: a cross-site form or image cannot
// set it, and a cross-origin fetch that sets it needs a preflight this
// server never grants.
const HeaderUI = "X-Esf-UI"

// Options configure a Server.
type Options struct {
	// Token is the secret every request must carry; empty draws 32 random
	// bytes.
	Token string
}

// Server is the web view's HTTP handler.
type Server struct {
	c     *client.Client
	token string
	hub   *hub
	files *fileCache
	mux   *http.ServeMux
}

// New returns the server of the view of c's daemon. Start must run for
// the groups list and the live updates.
func New(c *client.Client, opt Options) (*Server, error) {
	tok := opt.Token
	if tok == "" {
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		tok = hex.EncodeToString(b[:])
	}
	s := &Server{c: c, token: tok, hub: newHub(c), files: newFileCache(8), mux: http.NewServeMux()}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		b, _ := assets.ReadFile("assets/index.html")
		w.Write(b)
	})
	s.mux.HandleFunc("GET /api/groups", s.groups)
	s.mux.HandleFunc("GET /api/tree/{group}", s.tree)
	s.mux.HandleFunc("GET /api/inspect/{id}", s.inspect)
	s.mux.HandleFunc("GET /api/diff", s.diff)
	s.mux.HandleFunc("GET /api/filediff", s.fileDiff)
	s.mux.HandleFunc("GET /api/ls", s.ls)
	s.mux.HandleFunc("GET /api/file", s.file)
	s.mux.HandleFunc("GET /api/events", s.events)
	s.mux.HandleFunc("POST /api/fork", s.fork)
	s.mux.HandleFunc("POST /api/promote", s.promote)
	s.mux.HandleFunc("POST /api/prune", s.prune)
	return s, nil
}

// Token is the secret of the URL.
func (s *Server) Token() string { return s.token }

// URL is the address to open: the listener's address and the token.
func (s *Server) URL(addr net.Addr) string {
	return "http://" + addr.String() + "/?token=" + s.token
}

// Start follows the event log until ctx ends.
func (s *Server) Start(ctx context.Context) { go s.hub.run(ctx) }

// Serve starts the server and serves ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.Start(ctx)
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = hs.Shutdown(sctx)
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ListenLoopback listens on addr, which must name a loopback address.
func ListenLoopback(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--addr %q: %v: %w", addr, err, errdefs.ErrInvalidArgument)
	}
	ip := net.ParseIP(host)
	if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("--addr %q: the view serves loopback only (127.0.0.1, ::1 or localhost): %w", addr, errdefs.ErrInvalidArgument)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %v: %w", addr, err, errdefs.ErrUnavailable)
	}
	return ln, nil
}

func (s *Server) cookieName(r *http.Request) string {
	_, port, _ := net.SplitHostPort(r.Host)
	return "esf_ui_" + port // cookies ignore ports: one name per listener
}

func loopbackHost(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *Server) tokenOK(t string) bool {
	return t != "" && subtle.ConstantTimeCompare([]byte(t), []byte(s.token)) == 1
}

// ServeHTTP checks the Host and the token, then serves.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
	if !loopbackHost(r.Host) {
		http.Error(w, "forbidden: not a loopback host", http.StatusForbidden)
		return
	}
	if t := r.URL.Query().Get("token"); t != "" {
		if !s.tokenOK(t) {
			http.Error(w, "unauthorized: wrong token", http.StatusUnauthorized)
			return
		}
		http.SetCookie(w, &http.Cookie{Name: s.cookieName(r), Value: s.token, Path: "/", HttpOnly: true,
			SameSite: http.SameSiteStrictMode})
		if r.Method == http.MethodGet && r.URL.Path == "/" {
			// Out of the address bar and the history.
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
	} else if c, err := r.Cookie(s.cookieName(r)); err != nil || !s.tokenOK(c.Value) {
		http.Error(w, "unauthorized: open the URL esfctl ui printed (it carries the token)", http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Header.Get(HeaderUI) != "1" {
		http.Error(w, "forbidden: mutations need the "+HeaderUI+" header", http.StatusForbidden)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// writeErr answers with the daemon's error as JSON and its HTTP status.
func writeErr(w http.ResponseWriter, err error) {
	e := errdefs.Wire(err)
	status := http.StatusInternalServerError
	switch e.Code {
	case errdefs.CodeNotFound:
		status = http.StatusNotFound
	case errdefs.CodeInvalidArgument:
		status = http.StatusBadRequest
	case errdefs.CodeStaleGeneration, errdefs.CodeConflict, errdefs.CodeFailedPrecondition:
		status = http.StatusConflict
	case errdefs.CodeUnavailable:
		status = http.StatusBadGateway
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": e})
}

// GroupRow is one line of the groups view.
type GroupRow struct {
	GroupID         string    `json:"group_id"`
	Nodes           int       `json:"nodes"`
	RootNodeID      string    `json:"root_node_id"`
	CanonicalNodeID string    `json:"canonical_node_id"`
	Generation      uint64    `json:"generation"`
	LiveAttempts    int       `json:"live_attempts"`
	CreatedAt       time.Time `json:"created_at"`
}

// GroupsResponse is the body of GET /api/groups.
type GroupsResponse struct {
	Groups []GroupRow `json:"groups"`
	// Seq is the last event the list reflects.
	Seq uint64 `json:"seq"`
	// Error is the hub's last failure to read the event log, if it has
	// not recovered since.
	Error string `json:"error,omitempty"`
}

// readyWait bounds how long a request waits for the hub's first read of
// the event log.
const readyWait = 30 * time.Second

func (s *Server) waitReady(ctx context.Context) error {
	t := time.NewTimer(readyWait)
	defer t.Stop()
	select {
	case <-s.hub.ready:
		return nil
	case <-ctx.Done():
	case <-t.C:
	}
	_, _, _, lastErr := s.hub.groupsSnapshot()
	msg := "the event log is still being read"
	if lastErr != "" {
		msg += "; last error: " + lastErr
	}
	return &errdefs.Error{Code: errdefs.CodeUnavailable, Message: msg}
}

func (s *Server) groups(w http.ResponseWriter, r *http.Request) {
	if err := s.waitReady(r.Context()); err != nil {
		writeErr(w, err)
		return
	}
	ids, live, seq, lastErr := s.hub.groupsSnapshot()
	out := GroupsResponse{Groups: []GroupRow{}, Seq: seq, Error: lastErr}
	for _, id := range ids {
		in, err := s.c.Inspect(r.Context(), id, client.CallOptions{})
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		g := in.Group
		out.Groups = append(out.Groups, GroupRow{GroupID: g.GroupID, Nodes: g.Nodes, RootNodeID: g.RootNodeID,
			CanonicalNodeID: g.CanonicalNodeID, Generation: g.Generation, LiveAttempts: live[id], CreatedAt: g.CreatedAt})
	}
	writeJSON(w, out)
}

// raw passes the daemon's JSON answer through as it came.
func raw(w http.ResponseWriter, call func(client.CallOptions) error) {
	var b []byte
	if err := call(client.CallOptions{Raw: &b, RawOnly: true}); err != nil {
		writeErr(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

func (s *Server) tree(w http.ResponseWriter, r *http.Request) {
	raw(w, func(o client.CallOptions) error { _, err := s.c.Tree(r.Context(), r.PathValue("group"), o); return err })
}

func (s *Server) inspect(w http.ResponseWriter, r *http.Request) {
	raw(w, func(o client.CallOptions) error { _, err := s.c.Inspect(r.Context(), r.PathValue("id"), o); return err })
}

func (s *Server) diff(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	raw(w, func(o client.CallOptions) error {
		_, err := s.c.Diff(r.Context(), q.Get("a"), q.Get("b"), o)
		return err
	})
}

// maxPatch bounds the patch read for one file's text diff.
const maxPatch = 16 << 20

// fileDiff answers the part of the git patch from a to b about one path.
func (s *Server) fileDiff(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var buf limitedBuffer
	buf.max = maxPatch
	if _, err := s.c.Patch(r.Context(), q.Get("a"), q.Get("b"), &buf); err != nil && !buf.full {
		writeErr(w, err)
		return
	}
	writeJSON(w, map[string]any{"path": q.Get("path"), "patch": patchOf(buf.b, q.Get("path")), "truncated": buf.full})
}

type limitedBuffer struct {
	b    []byte
	max  int
	full bool
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > l.max {
		l.full = true
		return 0, errors.New("patch too large")
	}
	l.b = append(l.b, p...)
	return len(p), nil
}

// patchOf cuts the section of a git patch whose header names path.
func patchOf(patch []byte, path string) string {
	var out strings.Builder
	in := false
	for line := range strings.Lines(string(patch)) {
		if strings.HasPrefix(line, "diff --git ") {
			h := strings.TrimRight(line, "\n")
			in = strings.HasSuffix(h, " b/"+path) || strings.HasPrefix(h, "diff --git a/"+path+" ")
		}
		if in {
			out.WriteString(line)
		}
	}
	return out.String()
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	if err := s.waitReady(r.Context()); err != nil {
		writeErr(w, err)
		return
	}
	ch, seq := s.hub.subscribe()
	defer s.hub.unsubscribe(ch)
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "event: hello\ndata: {\"seq\":%d}\n\n", seq)
	if rc.Flush() != nil {
		return
	}
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keep.C:
			io.WriteString(w, ": keepalive\n\n")
		case ev, ok := <-ch:
			if !ok {
				return // fell behind or the hub stopped: the page reconnects
			}
			b, err := json.Marshal(ev)
			if err != nil {
				return
			}
			fmt.Fprintf(w, "data: %s\n\n", b)
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// decodeBody reads a small JSON body strictly.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: "body: " + err.Error()}
	}
	return nil
}

// callOptions gives each mutation an idempotency key, as esfctl does.
func callOptions() client.CallOptions {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return client.CallOptions{IdempotencyKey: "ui-" + hex.EncodeToString(b[:]), KeyGenerated: true}
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req v1.ForkRequest
	if err := decodeBody(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	res, err := s.c.Fork(r.Context(), req, callOptions())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, res)
}

func (s *Server) promote(w http.ResponseWriter, r *http.Request) {
	var req v1.PromoteRequest
	if err := decodeBody(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	res, err := s.c.Promote(r.Context(), req, callOptions())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, res)
}

func (s *Server) prune(w http.ResponseWriter, r *http.Request) {
	var req v1.PruneRequest
	if err := decodeBody(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	res, err := s.c.Prune(r.Context(), req, callOptions())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, res)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
