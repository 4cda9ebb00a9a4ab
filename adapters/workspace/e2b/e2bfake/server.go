package e2bfake

import (
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
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// Options shapes a Server. The zero value is a working E2B.
type Options struct {
	// APIKey, when set, must arrive as X-API-Key (or, with
	// Dialect.BearerAuth, as a Bearer token).
	APIKey string
	// Domain is the sandbox domain answered in create/connect and matched
	// in Host headers ("<port>-<id>.<Domain>"), default "e2b.app".
	Domain string
	// EnvdVersion is reported for every sandbox, default "0.6.13".
	EnvdVersion string
	// User and Home are envd's default user and home ("user",
	// "/home/user").
	User, Home string
	// Dir holds one directory per sandbox; default a new temporary
	// directory removed by Close.
	Dir string
	// CreateDelay is how long a create takes after the sandbox exists
	// (it is listed, and counted, from the start: a client that gives up
	// mid-create leaves it behind, as on the real service).
	CreateDelay time.Duration
	// PauseDelay and ResumeDelay are how long the transitions take; the
	// sandbox answers 409 to lifecycle calls meanwhile.
	PauseDelay, ResumeDelay time.Duration
	// TrafficToken gives every sandbox a traffic access token, which the
	// proxy then requires in the e2b-traffic-access-token header.
	TrafficToken bool
	// MaxSandboxes is the team's concurrency limit (429 on create); 0 is
	// unlimited.
	MaxSandboxes int
	// Keepalive is envd's keepalive interval when the client asks for
	// none.
	Keepalive time.Duration
	// Templates, when set, are the only template ids create accepts
	// (404 for others).
	Templates []string
	// Dialect is what the faked service does differently from E2B.
	Dialect Dialect
}

// Server is an offline E2B: the control plane at URL and, on the same
// listener, the edge proxy to each sandbox's envd, routed by the
// E2b-Sandbox-Id header or by a "<port>-<id>.<domain>" Host.
type Server struct {
	URL  string
	opts Options
	ts   *httptest.Server
	api  *http.ServeMux
	own  bool // Dir was created here

	mu        sync.Mutex
	sandboxes map[string]*fakeSandbox
	closed    bool
	limited   int           // requests left to answer 429
	retry     time.Duration // their Retry-After
	calls     map[string]int
	timers    sync.WaitGroup // asynchronous pauses
}

type fakeSandbox struct {
	id, template   string
	state          string // running, pausing, paused, resuming
	dir            string
	envd           *Envd
	token, traffic string
	metadata       map[string]string
	startedAt      time.Time
	endAt          time.Time // zero: never (Dialect.LooseTimeouts)
}

// New starts a Server; Close stops it.
func New(opts Options) (*Server, error) {
	if opts.Domain == "" {
		opts.Domain = "e2b.app"
	}
	if opts.EnvdVersion == "" {
		opts.EnvdVersion = "0.6.13"
	}
	if opts.User == "" {
		opts.User = "user"
	}
	if opts.Home == "" {
		opts.Home = "/home/" + opts.User
		if opts.User == "root" {
			opts.Home = "/root"
		}
	}
	if opts.Dialect.TrafficTokenHeader == "" {
		opts.Dialect.TrafficTokenHeader = envd.TrafficTokenE2B
	}
	if opts.Dialect.DefaultTimeout == 0 {
		opts.Dialect.DefaultTimeout = 15 * time.Second
	}
	s := &Server{opts: opts, sandboxes: map[string]*fakeSandbox{}, calls: map[string]int{}}
	if s.opts.Dir == "" {
		d, err := os.MkdirTemp("", "e2bfake-")
		if err != nil {
			return nil, err
		}
		s.opts.Dir, s.own = d, true
	}
	mux := http.NewServeMux()
	resume := s.resume
	if opts.Dialect.ConnectOK {
		resume = s.connect
	}
	for _, p := range slices.Compact([]string{"", opts.Dialect.Prefix}) {
		mux.HandleFunc("POST "+p+"/sandboxes", s.create)
		mux.HandleFunc("GET "+p+"/sandboxes", s.listV1)
		mux.HandleFunc("GET "+p+"/v2/sandboxes", s.listV2)
		mux.HandleFunc("GET "+p+"/sandboxes/{id}", s.get)
		mux.HandleFunc("DELETE "+p+"/sandboxes/{id}", s.kill)
		mux.HandleFunc("POST "+p+"/sandboxes/{id}/pause", s.pause)
		mux.HandleFunc("POST "+p+"/sandboxes/{id}/resume", resume)
		mux.HandleFunc("POST "+p+"/sandboxes/{id}/connect", s.connect)
		mux.HandleFunc("POST "+p+"/sandboxes/{id}/timeout", s.setTimeout)
		mux.HandleFunc("POST "+p+"/sandboxes/{id}/refreshes", s.refresh)
		mux.HandleFunc("GET "+p+"/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	}
	s.api = mux
	s.ts = httptest.NewServer(s)
	s.URL = s.ts.URL
	return s, nil
}

// Addr is the listener's host:port, for dialling it under a virtual host.
func (s *Server) Addr() string { return s.ts.Listener.Addr().String() }

// Close kills every sandbox and stops the server.
func (s *Server) Close() {
	s.ts.Close()
	s.mu.Lock()
	s.closed = true
	all := s.sandboxes
	s.sandboxes = map[string]*fakeSandbox{}
	s.mu.Unlock()
	s.timers.Wait()
	for _, sb := range all {
		if sb.envd != nil {
			sb.envd.Close()
		}
	}
	if s.own {
		_ = os.RemoveAll(s.opts.Dir)
	} else {
		for _, sb := range all {
			_ = os.RemoveAll(sb.dir)
		}
	}
}

// Count is the number of live (running or paused) sandboxes.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reapLocked()
	return len(s.sandboxes)
}

// Processes counts the processes running in all sandboxes.
func (s *Server) Processes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sb := range s.sandboxes {
		if sb.envd != nil {
			n += sb.envd.Processes()
		}
	}
	return n
}

// RateLimit makes the next n control-plane requests answer 429 with
// Retry-After (whole seconds, rounded up; none when retryAfter is 0 or
// the Dialect sends none).
func (s *Server) RateLimit(n int, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limited, s.retry = n, retryAfter
}

// Calls counts the control-plane requests served for a route pattern such
// as "POST /sandboxes/{id}/pause" (429 answers included).
func (s *Server) Calls(pattern string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[pattern]
}

// Kill removes a sandbox behind the clients' backs, as the service does
// when a sandbox times out.
func (s *Server) Kill(id string) bool {
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	delete(s.sandboxes, id)
	s.mu.Unlock()
	if ok {
		s.destroy(sb)
	}
	return ok
}

// Root is the host directory standing for a sandbox's "/".
func (s *Server) Root(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb, ok := s.sandboxes[id]; ok {
		return sb.dir
	}
	return ""
}

// destroy stops a sandbox already removed from the table. One whose envd
// is still booting is stopped by create when the boot ends.
func (s *Server) destroy(sb *fakeSandbox) {
	s.mu.Lock()
	e := sb.envd
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
	_ = os.RemoveAll(sb.dir)
}

// reapLocked kills running sandboxes whose lifetime ended.
func (s *Server) reapLocked() {
	now := time.Now()
	for id, sb := range s.sandboxes {
		if sb.state == "running" && !sb.endAt.IsZero() && now.After(sb.endAt) {
			delete(s.sandboxes, id)
			go s.destroy(sb)
		}
	}
}

// ServeHTTP routes envd traffic to the sandbox's envd and the rest to the
// control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok := s.envdRoute(r); ok {
		s.proxy(w, r, id, port)
		return
	}
	_, pattern := s.api.Handler(r)
	if p := s.opts.Dialect.Prefix; p != "" {
		pattern = strings.Replace(pattern, " "+p+"/", " /", 1)
	}
	s.mu.Lock()
	s.calls[pattern]++
	s.reapLocked()
	limited := s.limited > 0
	if limited {
		s.limited--
	}
	retry := s.retry
	s.mu.Unlock()
	if !s.authorized(r) {
		WriteError(w, http.StatusUnauthorized, "Invalid API key, please visit https://e2b.dev/docs to get your API key")
		return
	}
	if limited {
		if s.opts.Dialect.NoRetryAfter {
			WriteError(w, http.StatusTooManyRequests, "Rate limit exceeded")
		} else {
			writeRateLimited(w, retry)
		}
		return
	}
	s.api.ServeHTTP(w, r)
}

func (s *Server) authorized(r *http.Request) bool {
	key := s.opts.APIKey
	if key == "" || r.Header.Get("X-API-Key") == key {
		return true
	}
	tok, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return s.opts.Dialect.BearerAuth && bearer && tok == key
}

func writeRateLimited(w http.ResponseWriter, retry time.Duration) {
	secs := int(math.Ceil(retry.Seconds()))
	w.Header().Set("RateLimit-Limit", "20")
	w.Header().Set("RateLimit-Remaining", "0")
	w.Header().Set("RateLimit-Reset", strconv.Itoa(secs))
	if retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	WriteError(w, http.StatusTooManyRequests, "Rate limit exceeded")
}

func (s *Server) envdRoute(r *http.Request) (id string, port int, ok bool) {
	if id := r.Header.Get(envd.HeaderSandboxID); id != "" && !s.opts.Dialect.HostRouting {
		port := envd.DefaultPort
		if v := r.Header.Get(envd.HeaderSandboxPort); v != "" {
			port, _ = strconv.Atoi(v)
		}
		return id, port, true
	}
	return HostRoute(r.Host, s.opts.Domain)
}

// HostRoute parses "<port>-<id>.<domain>[:port]".
func HostRoute(host, domain string) (id string, port int, ok bool) {
	if h, _, found := strings.Cut(host, ":"); found {
		host = h
	}
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok {
		return "", 0, false
	}
	ps, id, ok := strings.Cut(label, "-")
	if !ok || id == "" {
		return "", 0, false
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return "", 0, false
	}
	return id, port, true
}

// proxy is the edge proxy: a sandbox that is missing or not running is a
// 502 with the proxy's JSON body.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, id string, port int) {
	s.mu.Lock()
	s.reapLocked()
	sb, ok := s.sandboxes[id]
	var e *Envd
	if ok && sb.state == "running" {
		e = sb.envd
	}
	running := e != nil
	s.mu.Unlock()
	if !running || port != envd.DefaultPort {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		_ = json.NewEncoder(w).Encode(map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway})
		return
	}
	if sb.traffic != "" && r.Header.Get(s.opts.Dialect.TrafficTokenHeader) != sb.traffic {
		WriteError(w, http.StatusForbidden, "missing or invalid traffic access token")
		return
	}
	e.ServeHTTP(w, r)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

type createBody struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int              `json:"timeout"`
	Secure     *bool             `json:"secure"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
}

// sandboxJSON is the Sandbox / SandboxDetail / ListedSandbox answer.
type sandboxJSON struct {
	TemplateID         string            `json:"templateID"`
	SandboxID          string            `json:"sandboxID"`
	ClientID           string            `json:"clientID"`
	EnvdVersion        string            `json:"envdVersion"`
	EnvdAccessToken    *string           `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string           `json:"trafficAccessToken"`
	Domain             *string           `json:"domain"`
	StartedAt          string            `json:"startedAt,omitempty"`
	EndAt              string            `json:"endAt,omitempty"`
	CPUCount           int               `json:"cpuCount,omitempty"`
	MemoryMB           int               `json:"memoryMB,omitempty"`
	DiskSizeMB         int               `json:"diskSizeMB,omitempty"`
	State              string            `json:"state,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
}

// publicState is what the API calls a state: running or paused, and
// pausing where the pause is asynchronous.
func (s *Server) publicState(st string) string {
	switch {
	case st == "paused" || st == "resuming":
		return "paused"
	case st == "pausing" && s.opts.Dialect.AsyncPause:
		return "pausing"
	}
	return "running"
}

func (s *Server) view(sb *fakeSandbox, detail bool) sandboxJSON {
	v := sandboxJSON{TemplateID: sb.template, SandboxID: sb.id, ClientID: "fakeclient", EnvdVersion: s.opts.EnvdVersion}
	domain := s.opts.Domain
	v.Domain = &domain
	if sb.token != "" {
		tok := sb.token
		v.EnvdAccessToken = &tok
	}
	if sb.traffic != "" && !detail {
		// SandboxDetail and ListedSandbox have no traffic token: only
		// create and connect hand it out.
		t := sb.traffic
		v.TrafficAccessToken = &t
	}
	if detail {
		v.StartedAt = sb.startedAt.UTC().Format(time.RFC3339)
		if !sb.endAt.IsZero() {
			v.EndAt = sb.endAt.UTC().Format(time.RFC3339)
		}
		v.CPUCount, v.MemoryMB, v.DiskSizeMB = 2, 512, 1024
		v.State = s.publicState(sb.state)
		v.Metadata = sb.metadata
	}
	return v
}

// checkTimeout enforces E2B's bounds on a timeout in seconds.
func (s *Server) checkTimeout(t int) error {
	if !s.opts.Dialect.LooseTimeouts && (t < 0 || t > 24*3600) {
		return fmt.Errorf("Timeout cannot be greater than 24 hours")
	}
	return nil
}

// deadline is t seconds from now; zero (never) when t is negative, which
// only LooseTimeouts lets through.
func deadline(from time.Time, t int) time.Time {
	if t < 0 {
		return time.Time{}
	}
	return from.Add(time.Duration(t) * time.Second)
}

// extendLocked moves a sandbox's end to t seconds from now if that is
// later; a sandbox that never ends stays so.
func extendLocked(sb *fakeSandbox, t int) {
	if end := deadline(time.Now(), t); !sb.endAt.IsZero() && end.After(sb.endAt) {
		sb.endAt = end
	}
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var body createBody
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		WriteError(w, http.StatusBadRequest, "Error when parsing request: "+err.Error())
		return
	}
	if body.TemplateID == "" {
		WriteError(w, http.StatusBadRequest, "Error when parsing request: templateID is required")
		return
	}
	if len(s.opts.Templates) > 0 && !slices.Contains(s.opts.Templates, body.TemplateID) {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("template %s not found", body.TemplateID))
		return
	}
	timeout := int(s.opts.Dialect.DefaultTimeout / time.Second)
	if body.Timeout != nil {
		timeout = *body.Timeout
	}
	if err := s.checkTimeout(timeout); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	if s.opts.MaxSandboxes > 0 && len(s.sandboxes) >= s.opts.MaxSandboxes {
		s.mu.Unlock()
		WriteError(w, http.StatusTooManyRequests, fmt.Sprintf(
			"you have reached the maximum number of concurrent E2B sandboxes (%d). If you need more, please contact us", s.opts.MaxSandboxes))
		return
	}
	s.mu.Unlock()
	sb := &fakeSandbox{
		id:        "i" + randomHex(10),
		template:  body.TemplateID,
		state:     "running",
		metadata:  body.Metadata,
		startedAt: time.Now(),
	}
	sb.endAt = deadline(sb.startedAt, timeout)
	if secure := s.opts.Dialect.SecureByDefault; body.Secure != nil && *body.Secure || body.Secure == nil && secure {
		sb.token = randomHex(16)
	}
	if s.opts.TrafficToken {
		sb.traffic = randomHex(16)
	}
	sb.dir = filepath.Join(s.opts.Dir, sb.id)
	// The sandbox exists (is listed and counted) from here on, while its
	// envd still boots: a client that gives up now has to find it.
	s.mu.Lock()
	s.sandboxes[sb.id] = sb
	s.mu.Unlock()
	e, err := NewEnvd(EnvdOptions{Root: sb.dir, User: s.opts.User, Home: s.opts.Home,
		AccessToken: sb.token, Env: body.EnvVars, Keepalive: s.opts.Keepalive})
	if err != nil {
		s.Kill(sb.id)
		WriteError(w, http.StatusInternalServerError, "failed to create sandbox: "+err.Error())
		return
	}
	s.mu.Lock()
	killed := s.sandboxes[sb.id] != sb
	sb.envd = e
	s.mu.Unlock()
	if killed {
		s.destroy(sb)
	}
	time.Sleep(s.opts.CreateDelay) // the client may leave meanwhile; the sandbox stays
	s.mu.Lock()
	v := s.view(sb, false)
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, v)
}

func (s *Server) notFound(w http.ResponseWriter, id string) {
	WriteError(w, http.StatusNotFound, fmt.Sprintf("Sandbox %q doesn't exist or you don't have access to it", id))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	var v sandboxJSON
	if ok {
		v = s.view(sb, true)
	}
	s.mu.Unlock()
	if !ok {
		s.notFound(w, id)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.Kill(id) {
		s.notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pause is synchronous, as E2B's is: 204 once the snapshot is taken; with
// Dialect.AsyncPause, 204 at once and the snapshot follows. Processes do
// not survive a pause in this fake (E2B keeps them in the memory
// snapshot).
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if !ok {
		s.mu.Unlock()
		s.notFound(w, id)
		return
	}
	switch sb.state {
	case "paused":
		s.mu.Unlock()
		WriteError(w, http.StatusConflict, fmt.Sprintf("Error pausing sandbox - sandbox '%s' is already paused", id))
		return
	case "running":
	default:
		st := sb.state
		s.mu.Unlock()
		WriteError(w, http.StatusConflict, fmt.Sprintf("Sandbox '%s' cannot be paused while in '%s' state", id, st))
		return
	}
	sb.state = "pausing"
	if s.opts.Dialect.AsyncPause {
		// Close waits for timers; it sets closed under mu, so no Add
		// can follow its Wait.
		s.timers.Add(1)
		go func() {
			defer s.timers.Done()
			s.snapshot(sb)
		}()
		s.mu.Unlock()
	} else {
		s.mu.Unlock()
		s.snapshot(sb)
	}
	w.WriteHeader(http.StatusNoContent)
}

// snapshot completes a pause unless the sandbox went away meanwhile.
func (s *Server) snapshot(sb *fakeSandbox) {
	s.mu.Lock()
	e := sb.envd
	s.mu.Unlock()
	if e != nil {
		e.KillAll()
	}
	time.Sleep(s.opts.PauseDelay)
	s.mu.Lock()
	if !s.closed && s.sandboxes[sb.id] == sb && sb.state == "pausing" {
		sb.state = "paused"
	}
	s.mu.Unlock()
}

// decodeTimeout reads {"timeout": seconds}; given says whether the body
// named one (else it is the default). A loose dialect ignores a body it
// cannot parse when the timeout is optional.
func (s *Server) decodeTimeout(r *http.Request, required bool) (timeout int, given bool, err error) {
	var body struct {
		Timeout *int `json:"timeout"`
	}
	err = json.NewDecoder(r.Body).Decode(&body)
	switch {
	case err != nil && (required || !s.opts.Dialect.LooseTimeouts):
		return 0, false, fmt.Errorf("Error when parsing request: %v", err)
	case body.Timeout == nil && required:
		return 0, false, fmt.Errorf("Error when parsing request: timeout is required")
	case body.Timeout == nil:
		return int(s.opts.Dialect.DefaultTimeout / time.Second), false, nil
	}
	return *body.Timeout, true, s.checkTimeout(*body.Timeout)
}

// connect answers 200 for a running sandbox (extending, never shortening,
// its lifetime) and resumes a paused one with 201 (200 with
// Dialect.ConnectOK).
func (s *Server) connect(w http.ResponseWriter, r *http.Request) { s.wake(w, r, true) }

// resume is the deprecated resume call: 201, or 409 unless paused.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) { s.wake(w, r, false) }

// wake resumes a paused sandbox for connect (connecting) or resume.
func (s *Server) wake(w http.ResponseWriter, r *http.Request, connecting bool) {
	id := r.PathValue("id")
	timeout, given, err := s.decodeTimeout(r, connecting && !s.opts.Dialect.LooseTimeouts)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	switch {
	case !ok:
		s.mu.Unlock()
		s.notFound(w, id)
	case sb.state == "running" && connecting:
		if given {
			extendLocked(sb, timeout)
		}
		v := s.view(sb, false)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, v)
	case sb.state == "paused":
		sb.state = "resuming"
		s.mu.Unlock()
		time.Sleep(s.opts.ResumeDelay)
		s.mu.Lock()
		sb.state = "running"
		// E2B's resume sets the lifetime; a loose dialect only extends
		// it, and only when asked.
		switch {
		case !s.opts.Dialect.LooseTimeouts:
			sb.endAt = deadline(time.Now(), timeout)
		case given:
			extendLocked(sb, timeout)
		}
		v := s.view(sb, false)
		s.mu.Unlock()
		status := http.StatusCreated
		if connecting && s.opts.Dialect.ConnectOK {
			status = http.StatusOK
		}
		writeJSON(w, status, v)
	case !connecting:
		s.mu.Unlock()
		WriteError(w, http.StatusConflict, fmt.Sprintf("Sandbox %s is already running", id))
	default:
		st := strings.TrimSuffix(sb.state, "ing")
		s.mu.Unlock()
		WriteError(w, http.StatusConflict, fmt.Sprintf("Sandbox %q is being %sd", id, st))
	}
}

// setTimeout sets the lifetime from now: 0 ends it, and with a loose
// dialect a negative timeout makes it endless.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	timeout, _, err := s.decodeTimeout(r, true)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if ok {
		sb.endAt = deadline(time.Now(), timeout)
	}
	s.mu.Unlock()
	if !ok {
		s.notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var body struct {
		Duration int `json:"duration"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil && err.Error() != "EOF" {
		WriteError(w, http.StatusBadRequest, "Error when parsing request: "+err.Error())
		return
	}
	if body.Duration < 0 || body.Duration > 3600 {
		WriteError(w, http.StatusBadRequest, "duration must be between 0 and 3600 seconds")
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if ok {
		extendLocked(sb, body.Duration)
	}
	s.mu.Unlock()
	if !ok {
		s.notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// metadataFilter parses the metadata query ("k=v&k2=v2", URL-encoded).
func metadataFilter(r *http.Request) (url.Values, error) {
	m := r.URL.Query().Get("metadata")
	if m == "" {
		return nil, nil
	}
	return url.ParseQuery(m)
}

func matches(sb *fakeSandbox, filter url.Values) bool {
	for k := range filter {
		if sb.metadata[k] != filter.Get(k) {
			return false
		}
	}
	return true
}

// listAll answers every sandbox, whatever the query (Dialect.ListAll).
func (s *Server) listAll(w http.ResponseWriter) {
	s.mu.Lock()
	out := []sandboxJSON{}
	for _, sb := range s.sorted() {
		out = append(out, s.view(sb, true))
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	if s.opts.Dialect.ListAll {
		s.listAll(w)
		return
	}
	filter, err := metadataFilter(r)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "Error when parsing metadata: "+err.Error())
		return
	}
	s.mu.Lock()
	out := []sandboxJSON{}
	for _, sb := range s.sorted() {
		if s.publicState(sb.state) == "running" && matches(sb, filter) {
			out = append(out, s.view(sb, true))
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// sorted lists sandboxes newest first, ids breaking ties (the API's
// default order). Call with s.mu held.
func (s *Server) sorted() []*fakeSandbox {
	all := make([]*fakeSandbox, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		all = append(all, sb)
	}
	sort.Slice(all, func(i, j int) bool {
		if !all[i].startedAt.Equal(all[j].startedAt) {
			return all[i].startedAt.After(all[j].startedAt)
		}
		return all[i].id < all[j].id
	})
	return all
}

// listV2 pages with limit and nextToken (the id to continue after) and
// reports X-Total-Running.
func (s *Server) listV2(w http.ResponseWriter, r *http.Request) {
	if s.opts.Dialect.ListAll {
		s.listAll(w)
		return
	}
	q := r.URL.Query()
	filter, err := metadataFilter(r)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "Error when parsing metadata: "+err.Error())
		return
	}
	states := map[string]bool{"running": true, "paused": true}
	if v := q.Get("state"); v != "" {
		states = map[string]bool{}
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				WriteError(w, http.StatusBadRequest, "invalid state: "+st)
				return
			}
			states[st] = true
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			WriteError(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		limit = n
	}
	after := q.Get("nextToken")
	s.mu.Lock()
	var out []sandboxJSON
	running := 0
	skipping := after != ""
	next := ""
	for _, sb := range s.sorted() {
		st := s.publicState(sb.state)
		if !states[st] || !matches(sb, filter) {
			continue
		}
		if st == "running" {
			running++
		}
		if skipping {
			if sb.id == after {
				skipping = false
			}
			continue
		}
		if len(out) == limit {
			if next == "" {
				next = out[len(out)-1].SandboxID
			}
			continue
		}
		out = append(out, s.view(sb, true))
	}
	s.mu.Unlock()
	if out == nil {
		out = []sandboxJSON{}
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	if states["running"] {
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
	}
	writeJSON(w, http.StatusOK, out)
}
