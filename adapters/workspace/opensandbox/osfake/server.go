package osfake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ExecdPort is the only sandbox port the fake serves (execd's).
const ExecdPort = 44772

// Options shape a Server. The zero value is a fast, auth-less server.
type Options struct {
	// APIKey, when set, is required in OPEN-SANDBOX-API-KEY on lifecycle
	// calls (401 MISSING_API_KEY / INVALID_API_KEY otherwise).
	APIKey string
	// Home is the sandbox user's home as the sandbox sees it; "" is /root.
	Home string
	// ProvisionDelay is Pending -> Running (or Failed); PauseDelay is
	// Pausing -> Paused; ResumeDelay is Resuming -> Running. Zero means 20ms
	// each; negative means immediate.
	ProvisionDelay, PauseDelay, ResumeDelay time.Duration
	// ExecdStartDelay is how long execd refuses connections (502 from the
	// proxy) after the sandbox starts running.
	ExecdStartDelay time.Duration
	// FrozenTimeout is how long a request to execd of a sandbox that is not
	// running hangs before the proxy gives up with 500 (the real proxy's
	// read timeout is 180s). Zero means 2s.
	FrozenTimeout time.Duration
	// GracefulDelay is how long execd keeps a command stream open after its
	// last event (execd's --graceful-shutdown-timeout, 1s by default). Zero
	// means 1s; negative means none.
	GracefulDelay time.Duration
	// TailInterval is how often command output files are polled for new
	// lines (execd polls every 100ms). Zero means 20ms.
	TailInterval time.Duration
	// FailImages are image URIs whose provisioning fails (state Failed,
	// reason PROVISIONING_ERROR).
	FailImages []string
	// FailedTTL is how long a failed provision stays visible; zero means 1s.
	FailedTTL time.Duration
	// CreateLatency delays the create response after the sandbox exists,
	// as a slow server or a lost response would: a client that gives up
	// meanwhile has made a sandbox it never heard of.
	CreateLatency time.Duration
	// Dir holds the sandboxes' directories; "" means a temporary directory
	// that Close removes.
	Dir string
	// Unisolated runs commands straight on the host, in the mapped working
	// directory with HOME and TMPDIR mapped, instead of chrooted into the
	// sandbox root; for hosts that allow no mount namespace. Absolute paths
	// in commands then name host paths.
	Unisolated bool
}

func (o *Options) defaults() {
	if o.Home == "" {
		o.Home = "/root"
	}
	for _, d := range []*time.Duration{&o.ProvisionDelay, &o.PauseDelay, &o.ResumeDelay} {
		if *d == 0 {
			*d = 20 * time.Millisecond
		}
		if *d < 0 {
			*d = 0
		}
	}
	if o.FrozenTimeout <= 0 {
		o.FrozenTimeout = 2 * time.Second
	}
	if o.GracefulDelay == 0 {
		o.GracefulDelay = time.Second
	}
	if o.GracefulDelay < 0 {
		o.GracefulDelay = 0
	}
	if o.TailInterval <= 0 {
		o.TailInterval = 20 * time.Millisecond
	}
	if o.FailedTTL <= 0 {
		o.FailedTTL = time.Second
	}
}

// Server is a running fake. Its methods are safe for concurrent use.
type Server struct {
	opts    Options
	ts      *httptest.Server
	exec    http.Handler // execd's routes, behind the proxy
	layout  hostLayout
	zygote  *zygote // nil when Unisolated
	dir     string
	ownDir  bool
	closing chan struct{}

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	limits    []*rateRule
	closed    bool

	running  atomic.Int64 // command processes alive
	started  atomic.Int64 // command processes ever started
	creates  atomic.Int64 // sandboxes ever created
	requests atomic.Int64
	bg       sync.WaitGroup // process reapers and other goroutines the server owns
}

// New starts a fake on a local port.
func New(opts Options) (*Server, error) {
	opts.defaults()
	s := &Server{opts: opts, closing: make(chan struct{}), sandboxes: map[string]*sandbox{}}
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "osfake-*")
		if err != nil {
			return nil, err
		}
		s.dir, s.ownDir = d, true
	} else {
		if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
			return nil, err
		}
		s.dir = opts.Dir
	}
	s.exec = s.execdMux()
	if !opts.Unisolated {
		s.layout = probeHost()
		z, err := startZygote(s.layout)
		if err != nil {
			if s.ownDir {
				os.RemoveAll(s.dir)
			}
			return nil, err
		}
		s.zygote = z
	}
	s.ts = httptest.NewServer(s.routes())
	return s, nil
}

// URL is the server's root (what a client's base URL is); the lifecycle
// API is under URL()+"/v1".
func (s *Server) URL() string { return s.ts.URL }

// Client is an HTTP client for the server.
func (s *Server) Client() *http.Client { return s.ts.Client() }

// Close deletes every sandbox (killing its processes), stops the server
// and removes the directory it made.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.closing)
	ids := make([]string, 0, len(s.sandboxes))
	for id := range s.sandboxes {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.remove(id, "server_close")
	}
	s.ts.CloseClientConnections()
	s.ts.Close()
	s.bg.Wait()
	if s.zygote != nil {
		s.zygote.stop()
	}
	if s.ownDir {
		os.RemoveAll(s.dir)
	}
}

// Live is the number of sandboxes that exist (any state but a failed
// provision, which holds nothing).
func (s *Server) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sb := range s.sandboxes {
		if sb.state != "Failed" {
			n++
		}
	}
	return n
}

// RunningCommands is the number of command processes alive in all
// sandboxes (foreground and background).
func (s *Server) RunningCommands() int { return int(s.running.Load()) }

// CommandsStarted counts command processes ever started.
func (s *Server) CommandsStarted() int { return int(s.started.Load()) }

// Created counts sandboxes ever created.
func (s *Server) Created() int { return int(s.creates.Load()) }

// Requests counts every HTTP request the server received.
func (s *Server) Requests() int { return int(s.requests.Load()) }

// State is a sandbox's lifecycle state, "" when it does not exist.
func (s *Server) State(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil {
		return sb.state
	}
	return ""
}

// Root is the host directory that is the sandbox's "/", "" when the
// sandbox does not exist.
func (s *Server) Root(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil {
		return sb.root
	}
	return ""
}

// Env is the environment a sandbox was created with.
func (s *Server) Env(id string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil {
		return clone(sb.env)
	}
	return nil
}

// Timeout is the TTL a sandbox was created with (0: manual cleanup).
func (s *Server) Timeout(id string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil {
		return sb.timeout
	}
	return 0
}

// RateLimit answers the next n requests whose "METHOD /path" starts with
// prefix (e.g. "GET /v1/sandboxes/", "POST /sandboxes") with 429 and
// Retry-After (whole seconds, at least 1, as the spec's header says).
func (s *Server) RateLimit(prefix string, n int, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits = append(s.limits, &rateRule{prefix: prefix, left: n, after: retryAfter})
}

type rateRule struct {
	prefix string
	left   int
	after  time.Duration
}

// ---- sandboxes ----

type sandbox struct {
	id             string
	image          string
	entrypoint     []string
	metadata       map[string]string
	env            map[string]string
	resourceLimits map[string]string
	timeout        time.Duration
	createdAt      time.Time
	expiresAt      *time.Time

	state, reason, message string
	transitionAt           time.Time
	runningSince           time.Time
	changed                chan struct{} // closed at every state change
	timer                  *time.Timer   // the pending transition
	ttl                    *time.Timer

	dir, root, logs, spool string
	token                  string

	cmds   map[string]*command
	nextID int
}

// setState moves sb to state; s.mu held.
func (sb *sandbox) setState(state, reason, message string) {
	sb.state, sb.reason, sb.message = state, reason, message
	sb.transitionAt = time.Now().UTC()
	if state == "Running" {
		sb.runningSince = time.Now()
	}
	close(sb.changed)
	sb.changed = make(chan struct{})
}

// signalAll sends sig to every running command's process group; s.mu held.
func (sb *sandbox) signalAll(sig syscall.Signal) {
	for _, c := range sb.cmds {
		if c.running && c.pid > 0 {
			_ = syscall.Kill(-c.pid, sig)
		}
	}
}

// schedule runs fn (with s.mu held) after d unless the sandbox changes or
// goes away first.
func (s *Server) schedule(sb *sandbox, d time.Duration, fn func()) {
	if sb.timer != nil {
		sb.timer.Stop()
	}
	ch := sb.changed
	sb.timer = time.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.sandboxes[sb.id] != sb || sb.changed != ch {
			return
		}
		fn()
	})
}

// remove deletes a sandbox: kills its processes, waits for them, removes
// its directory. It reports whether the sandbox existed.
func (s *Server) remove(id, reason string) bool {
	s.mu.Lock()
	sb := s.sandboxes[id]
	if sb == nil {
		s.mu.Unlock()
		return false
	}
	delete(s.sandboxes, id)
	if sb.timer != nil {
		sb.timer.Stop()
	}
	if sb.ttl != nil {
		sb.ttl.Stop()
	}
	sb.signalAll(syscall.SIGKILL)
	sb.setState("Terminated", reason, "")
	var exits []chan struct{}
	for _, c := range sb.cmds {
		exits = append(exits, c.exited)
	}
	s.mu.Unlock()
	for _, ch := range exits {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
		}
	}
	if s.zygote != nil {
		s.zygote.release(sb.root)
	}
	os.RemoveAll(sb.dir)
	return true
}

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func clone(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// ---- HTTP plumbing ----

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", s.create)
	mux.HandleFunc("GET /v1/sandboxes", s.list)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.delete)
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", s.pause)
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", s.resume)
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/{port}", s.endpoint)
	mux.HandleFunc("/sandboxes/{id}/proxy/{port}/{rest...}", s.proxy)
	mux.HandleFunc("/v1/sandboxes/{id}/proxy/{port}/{rest...}", s.proxy)
	return s.middleware(mux)
}

// middleware adds the request id, enforces rate limits and, outside the
// proxy route (which the real server leaves to execd's token), the API key.
func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		w.Header().Set("X-Request-ID", newID())
		if ra, ok := s.limited(r); ok {
			secs := int(math.Ceil(ra.Seconds()))
			w.Header().Set("Retry-After", strconv.Itoa(max(1, secs)))
			apiError(w, http.StatusTooManyRequests, "TOO_MANY_REQUESTS", "Rate limit exceeded; retry later.")
			return
		}
		if s.opts.APIKey != "" && strings.HasPrefix(r.URL.Path, "/v1/") && !proxyPath.MatchString(r.URL.Path) {
			key := r.Header.Get("OPEN-SANDBOX-API-KEY")
			switch {
			case key == "":
				apiError(w, http.StatusUnauthorized, "MISSING_API_KEY", "Authentication credentials are missing. Provide API key via OPEN-SANDBOX-API-KEY header.")
				return
			case key != s.opts.APIKey:
				apiError(w, http.StatusUnauthorized, "INVALID_API_KEY", "Authentication credentials are invalid. Check your API key and try again.")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

var proxyPath = regexp.MustCompile(`^(/v1)?/sandboxes/[^/]+/proxy/\d+(/|$)`)

func (s *Server) limited(r *http.Request) (time.Duration, bool) {
	key := r.Method + " " + r.URL.Path
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.limits {
		if l.left > 0 && strings.HasPrefix(key, l.prefix) {
			l.left--
			return l.after, true
		}
	}
	return 0, false
}

// apiError writes the lifecycle server's error body.
func apiError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"code": code, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// validationError is FastAPI's 422 for a body or query that fails the
// schema (it bypasses the server's {"code","message"} normaliser).
func validationError(w http.ResponseWriter, loc []string, msg string) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{
		"detail": []map[string]any{{"type": "value_error", "loc": loc, "msg": msg}},
	})
}

// ---- lifecycle API ----

type imageSpec struct {
	URI string `json:"uri"`
}

type createRequest struct {
	Image          *imageSpec        `json:"image"`
	SnapshotID     string            `json:"snapshotId"`
	Entrypoint     []string          `json:"entrypoint"`
	ResourceLimits map[string]string `json:"resourceLimits"`
	Timeout        *int64            `json:"timeout"`
	Env            map[string]string `json:"env"`
	Metadata       map[string]string `json:"metadata"`
}

type statusJSON struct {
	State            string    `json:"state"`
	Reason           string    `json:"reason,omitempty"`
	Message          string    `json:"message,omitempty"`
	LastTransitionAt time.Time `json:"lastTransitionAt"`
}

type sandboxJSON struct {
	ID         string            `json:"id"`
	Image      *imageSpec        `json:"image,omitempty"`
	Status     statusJSON        `json:"status"`
	Metadata   map[string]string `json:"metadata"`
	Entrypoint []string          `json:"entrypoint"`
	ExpiresAt  *time.Time        `json:"expiresAt,omitempty"`
	CreatedAt  time.Time         `json:"createdAt"`
}

// view renders sb; s.mu held. The create response has no image.
func (sb *sandbox) view(withImage bool) sandboxJSON {
	v := sandboxJSON{
		ID:         sb.id,
		Status:     statusJSON{State: sb.state, Reason: sb.reason, Message: sb.message, LastTransitionAt: sb.transitionAt},
		Metadata:   clone(sb.metadata),
		Entrypoint: sb.entrypoint,
		ExpiresAt:  sb.expiresAt,
		CreatedAt:  sb.createdAt,
	}
	if v.Metadata == nil {
		v.Metadata = map[string]string{}
	}
	if withImage {
		v.Image = &imageSpec{URI: sb.image}
	}
	return v
}

var (
	labelName    = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// labelError checks metadata against Kubernetes label rules, as the server
// does on create.
func labelError(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := md[k]
		if strings.HasPrefix(k, "opensandbox.io/") {
			return fmt.Sprintf("Metadata key '%s' uses the reserved prefix 'opensandbox.io/'. Keys under this prefix are managed by the system and cannot be set via metadata.", k)
		}
		name := k
		if prefix, n, ok := strings.Cut(k, "/"); ok {
			if prefix == "" || len(prefix) > 253 || !dnsSubdomain.MatchString(prefix) {
				return fmt.Sprintf("Metadata key '%s' is invalid.", k)
			}
			name = n
		}
		if len(name) > 63 || !labelName.MatchString(name) {
			return fmt.Sprintf("Metadata key '%s' is invalid.", k)
		}
		if len(v) > 63 || (v != "" && !labelName.MatchString(v)) {
			return fmt.Sprintf("Metadata value '%s' is invalid: must be 63 characters or less, start/end with an alphanumeric character, and contain only alphanumeric, '-', '_', or '.' characters.", v)
		}
	}
	return ""
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		validationError(w, []string{"body"}, "JSON decode error: "+err.Error())
		return
	}
	if req.Timeout != nil && *req.Timeout < 60 {
		validationError(w, []string{"body", "timeout"}, "Input should be greater than or equal to 60")
		return
	}
	hasImage := req.Image != nil && req.Image.URI != ""
	if hasImage == (req.SnapshotID != "") {
		apiError(w, http.StatusBadRequest, "SANDBOX::INVALID_PARAMETER", "Exactly one of image or snapshotId must be provided.")
		return
	}
	if !hasImage {
		apiError(w, http.StatusBadRequest, "SANDBOX::API_NOT_SUPPORTED", "The fake cannot restore snapshots.")
		return
	}
	if len(req.Entrypoint) == 0 || req.Entrypoint[0] == "" {
		apiError(w, http.StatusBadRequest, "DOCKER::INVALID_ENTRYPOINT", "Entrypoint must be a non-empty list of strings.")
		return
	}
	if msg := labelError(req.Metadata); msg != "" {
		apiError(w, http.StatusBadRequest, "SANDBOX::INVALID_METADATA_LABEL", msg)
		return
	}
	id := newID()
	dir := filepath.Join(s.dir, id)
	sb := &sandbox{
		id: id, image: req.Image.URI, entrypoint: req.Entrypoint, metadata: clone(req.Metadata),
		env: clone(req.Env), resourceLimits: clone(req.ResourceLimits),
		createdAt: time.Now().UTC(), changed: make(chan struct{}), cmds: map[string]*command{},
		dir: dir, root: filepath.Join(dir, "root"), logs: filepath.Join(dir, "logs"), spool: filepath.Join(dir, "spool"),
		token: newID(),
	}
	for _, d := range []string{sb.root, sb.logs, sb.spool, sb.host(s.opts.Home), sb.host("/tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			apiError(w, http.StatusInternalServerError, "DOCKER::SANDBOX_START_FAILED", err.Error())
			return
		}
	}
	if s.zygote != nil {
		err := s.layout.layOut(sb.root)
		if err == nil {
			err = s.zygote.prepare(sb.root)
		}
		if err != nil {
			os.RemoveAll(dir)
			apiError(w, http.StatusInternalServerError, "DOCKER::SANDBOX_START_FAILED", err.Error())
			return
		}
	}
	_ = os.Chmod(sb.host("/tmp"), 0o1777)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		os.RemoveAll(dir)
		apiError(w, http.StatusServiceUnavailable, "GENERAL::UNKNOWN_ERROR", "server is shutting down")
		return
	}
	s.creates.Add(1)
	s.sandboxes[id] = sb
	sb.setState("Pending", "provisioning", "Sandbox is being provisioned.")
	if req.Timeout != nil {
		sb.timeout = time.Duration(*req.Timeout) * time.Second
		exp := sb.createdAt.Add(sb.timeout)
		sb.expiresAt = &exp
		sb.ttl = time.AfterFunc(sb.timeout, func() { s.remove(id, "ttl_expiry") })
	}
	fail := slices.Contains(s.opts.FailImages, sb.image)
	s.schedule(sb, s.opts.ProvisionDelay, func() {
		if fail {
			sb.setState("Failed", "PROVISIONING_ERROR", "Failed to pull image "+sb.image)
			if sb.ttl != nil {
				sb.ttl.Stop()
			}
			sb.ttl = time.AfterFunc(s.opts.FailedTTL, func() { s.remove(id, "failed") })
			return
		}
		sb.setState("Running", "", "")
	})
	view := sb.view(false)
	s.mu.Unlock()
	if s.opts.CreateLatency > 0 {
		t := time.NewTimer(s.opts.CreateLatency)
		select {
		case <-t.C:
		case <-r.Context().Done():
		case <-s.closing:
		}
		t.Stop()
	}
	w.Header().Set("Location", "/v1/sandboxes/"+id)
	writeJSON(w, http.StatusAccepted, view)
}

func (s *Server) notFound(w http.ResponseWriter, id string) {
	apiError(w, http.StatusNotFound, "DOCKER::SANDBOX_NOT_FOUND", fmt.Sprintf("Sandbox %s not found.", id))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	sb := s.sandboxes[id]
	if sb == nil {
		s.mu.Unlock()
		s.notFound(w, id)
		return
	}
	v := sb.view(true)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	page, pageSize := 1, 20
	for name, dst := range map[string]*int{"page": &page, "pageSize": &pageSize} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				validationError(w, []string{"query", name}, "Input should be greater than or equal to 1")
				return
			}
			*dst = n
		}
	}
	var filter url.Values
	if m := q.Get("metadata"); m != "" {
		f, err := url.ParseQuery(m)
		if err != nil {
			apiError(w, http.StatusBadRequest, "INVALID_METADATA_FORMAT", "Invalid metadata format: "+err.Error())
			return
		}
		filter = f
	}
	states := q["state"]
	s.mu.Lock()
	var items []sandboxJSON
	for _, sb := range s.sandboxes {
		if len(states) > 0 && !slices.Contains(states, sb.state) {
			continue
		}
		match := true
		for k, vs := range filter {
			if v, ok := sb.metadata[k]; !ok || v != vs[len(vs)-1] {
				match = false
			}
		}
		if match {
			items = append(items, sb.view(true))
		}
	}
	s.mu.Unlock()
	sort.Slice(items, func(i, j int) bool {
		if !items[i].CreatedAt.Equal(items[j].CreatedAt) {
			return items[i].CreatedAt.After(items[j].CreatedAt)
		}
		return items[i].ID < items[j].ID
	})
	total := len(items)
	pages := (total + pageSize - 1) / pageSize
	start := min((page-1)*pageSize, total)
	end := min(start+pageSize, total)
	writeJSON(w, http.StatusOK, map[string]any{
		"items": append([]sandboxJSON{}, items[start:end]...),
		"pagination": map[string]any{
			"page": page, "pageSize": pageSize, "totalItems": total, "totalPages": pages, "hasNextPage": page < pages,
		},
	})
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	sb := s.sandboxes[id]
	failed := sb != nil && sb.state == "Failed"
	s.mu.Unlock()
	// A failed provision has no container: the Docker runtime answers 404
	// and forgets the record after a while by itself.
	if sb == nil || failed || !s.remove(id, "user_delete") {
		s.notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	switch {
	case sb == nil:
		s.notFound(w, id)
		return
	case sb.state != "Running":
		apiError(w, http.StatusConflict, "DOCKER::SANDBOX_NOT_RUNNING", "Sandbox is not in a running state.")
		return
	}
	sb.setState("Pausing", "pause_requested", "")
	sb.signalAll(syscall.SIGSTOP)
	s.schedule(sb, s.opts.PauseDelay, func() { sb.setState("Paused", "", "") })
	w.WriteHeader(http.StatusAccepted)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	switch {
	case sb == nil:
		s.notFound(w, id)
		return
	case sb.state != "Paused":
		apiError(w, http.StatusConflict, "DOCKER::SANDBOX_NOT_PAUSED", "Sandbox is not in a paused state.")
		return
	}
	sb.setState("Resuming", "resume_requested", "")
	s.schedule(sb, s.opts.ResumeDelay, func() {
		sb.setState("Running", "", "")
		sb.signalAll(syscall.SIGCONT)
	})
	w.WriteHeader(http.StatusAccepted)
}

// endpoint answers in the server-proxy shape whatever use_server_proxy
// says: every sandbox's execd is served by this one listener under
// /sandboxes/{id}/proxy/{port}. The access token header is what execd
// checks.
func (s *Server) endpoint(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		apiError(w, http.StatusBadRequest, "DOCKER::INVALID_PORT", "Port must be between 1 and 65535.")
		return
	}
	q := r.URL.Query()
	if q.Get("expires") != "" {
		if q.Get("use_server_proxy") == "true" {
			apiError(w, http.StatusBadRequest, "SANDBOX::INVALID_PARAMETER", "use_server_proxy cannot be combined with expires.")
			return
		}
		apiError(w, http.StatusBadRequest, "SANDBOX::API_NOT_SUPPORTED", "Signed routes (expires parameter) are not supported when runtime.type='docker'.")
		return
	}
	s.mu.Lock()
	sb := s.sandboxes[id]
	if sb == nil || sb.state == "Pending" || sb.state == "Failed" {
		// No container (yet): the Docker runtime's lookup finds nothing.
		s.mu.Unlock()
		s.notFound(w, id)
		return
	}
	token := sb.token
	s.mu.Unlock()
	host := strings.TrimPrefix(strings.TrimPrefix(s.ts.URL, "http://"), "https://")
	writeJSON(w, http.StatusOK, map[string]any{
		"endpoint": fmt.Sprintf("%s/sandboxes/%s/proxy/%d", host, id, port),
		"headers":  map[string]string{execdTokenHeader: token},
	})
}

// proxy stands for the lifecycle server's proxy in front of the sandbox's
// execd, with the sandbox's state deciding what gets through: nothing while
// it has no container (404), a hang while it is frozen (paused; 500 after
// FrozenTimeout, as the real proxy's read timeout), 502 while execd has
// not started yet.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	port := r.PathValue("port")
	deadline := time.NewTimer(s.opts.FrozenTimeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		sb := s.sandboxes[id]
		if sb == nil || sb.state == "Pending" || sb.state == "Failed" {
			s.mu.Unlock()
			s.notFound(w, id)
			return
		}
		if port != strconv.Itoa(ExecdPort) {
			s.mu.Unlock()
			apiError(w, http.StatusBadGateway, "GENERAL::UNKNOWN_ERROR", "Could not connect to the backend sandbox: connection refused")
			return
		}
		state, changed, since, token := sb.state, sb.changed, sb.runningSince, sb.token
		s.mu.Unlock()
		if state == "Running" {
			if time.Since(since) < s.opts.ExecdStartDelay {
				apiError(w, http.StatusBadGateway, "GENERAL::UNKNOWN_ERROR", "Could not connect to the backend sandbox: connection refused")
				return
			}
			if got := r.Header.Get(execdTokenHeader); got != token {
				writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "Unauthorized: invalid or missing header " + execdTokenHeader})
				return
			}
			r2 := r.Clone(context.WithValue(r.Context(), sandboxKey{}, sb))
			r2.URL.Path = "/" + r.PathValue("rest")
			r2.URL.RawPath = ""
			s.exec.ServeHTTP(w, r2)
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			apiError(w, http.StatusInternalServerError, "GENERAL::UNKNOWN_ERROR", "An internal error occurred in the proxy: ReadTimeout")
			return
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		}
	}
}

type sandboxKey struct{}
