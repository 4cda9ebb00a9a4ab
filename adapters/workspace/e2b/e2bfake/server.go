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
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// Options shapes a Server. The zero value is a working E2B.
type Options struct {
	// APIKey, when set, must arrive as X-API-Key.
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
	limited   int           // requests left to answer 429
	retry     time.Duration // their Retry-After
	calls     map[string]int
}

type fakeSandbox struct {
	id, template   string
	state          string // running, pausing, paused, resuming
	dir            string
	envd           *Envd
	token, traffic string
	metadata       map[string]string
	startedAt      time.Time
	endAt          time.Time
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
	s := &Server{opts: opts, sandboxes: map[string]*fakeSandbox{}, calls: map[string]int{}}
	if s.opts.Dir == "" {
		d, err := os.MkdirTemp("", "e2bfake-")
		if err != nil {
			return nil, err
		}
		s.opts.Dir, s.own = d, true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", s.create)
	mux.HandleFunc("GET /sandboxes", s.listV1)
	mux.HandleFunc("GET /v2/sandboxes", s.listV2)
	mux.HandleFunc("GET /sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.resume)
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", s.refresh)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
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
	all := s.sandboxes
	s.sandboxes = map[string]*fakeSandbox{}
	s.mu.Unlock()
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
// Retry-After (whole seconds, rounded up; none when retryAfter is 0).
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
		if sb.state == "running" && now.After(sb.endAt) {
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
	s.mu.Lock()
	s.calls[pattern]++
	s.reapLocked()
	limited := s.limited > 0
	if limited {
		s.limited--
	}
	retry := s.retry
	s.mu.Unlock()
	if s.opts.APIKey != "" && r.Header.Get("X-API-Key") != s.opts.APIKey {
		WriteError(w, http.StatusUnauthorized, "Invalid API key, please visit https://e2b.dev/docs to get your API key")
		return
	}
	if limited {
		writeRateLimited(w, retry)
		return
	}
	s.api.ServeHTTP(w, r)
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
	if id := r.Header.Get(envd.HeaderSandboxID); id != "" {
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
	if sb.traffic != "" && r.Header.Get(envd.TrafficTokenE2B) != sb.traffic {
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
	Secure     bool              `json:"secure"`
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

// publicState is what the API calls a state: only running or paused.
func publicState(st string) string {
	if st == "paused" || st == "resuming" {
		return "paused"
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
		v.EndAt = sb.endAt.UTC().Format(time.RFC3339)
		v.CPUCount, v.MemoryMB, v.DiskSizeMB = 2, 512, 1024
		v.State = publicState(sb.state)
		v.Metadata = sb.metadata
	}
	return v
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
	timeout := 15
	if body.Timeout != nil {
		timeout = *body.Timeout
	}
	if timeout < 0 || timeout > 24*3600 {
		WriteError(w, http.StatusBadRequest, "Timeout cannot be greater than 24 hours")
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
	sb.endAt = sb.startedAt.Add(time.Duration(timeout) * time.Second)
	if body.Secure {
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

// pause is synchronous, as E2B's is: 204 once the snapshot is taken.
// Processes do not survive a pause in this fake (E2B keeps them in the
// memory snapshot).
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
	e := sb.envd
	s.mu.Unlock()
	if e != nil {
		e.KillAll()
	}
	time.Sleep(s.opts.PauseDelay)
	s.mu.Lock()
	if cur, ok := s.sandboxes[id]; ok && cur == sb {
		sb.state = "paused"
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// resumeLocked starts a resume of a paused sandbox and returns a function
// that completes it; the caller unlocks before calling it.
func (s *Server) resumeLocked(sb *fakeSandbox, timeout int) func() {
	sb.state = "resuming"
	return func() {
		time.Sleep(s.opts.ResumeDelay)
		s.mu.Lock()
		sb.state = "running"
		sb.endAt = time.Now().Add(time.Duration(timeout) * time.Second)
		s.mu.Unlock()
	}
}

func decodeTimeout(r *http.Request, required bool) (int, error) {
	var body struct {
		Timeout *int `json:"timeout"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("Error when parsing request: %v", err)
	}
	if body.Timeout == nil {
		if required {
			return 0, fmt.Errorf("Error when parsing request: timeout is required")
		}
		return 15, nil
	}
	if *body.Timeout < 0 || *body.Timeout > 24*3600 {
		return 0, fmt.Errorf("Timeout cannot be greater than 24 hours")
	}
	return *body.Timeout, nil
}

// connect answers 200 for a running sandbox (extending, never shortening,
// its lifetime) and resumes a paused one with 201.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	timeout, err := decodeTimeout(r, true)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if !ok {
		s.mu.Unlock()
		s.notFound(w, id)
		return
	}
	switch sb.state {
	case "running":
		if end := time.Now().Add(time.Duration(timeout) * time.Second); end.After(sb.endAt) {
			sb.endAt = end
		}
		v := s.view(sb, false)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, v)
	case "paused":
		finish := s.resumeLocked(sb, timeout)
		s.mu.Unlock()
		finish()
		s.mu.Lock()
		v := s.view(sb, false)
		s.mu.Unlock()
		writeJSON(w, http.StatusCreated, v)
	default:
		st := strings.TrimSuffix(sb.state, "ing")
		s.mu.Unlock()
		WriteError(w, http.StatusConflict, fmt.Sprintf("Sandbox %q is being %sd", id, st))
	}
}

// resume is the deprecated resume call: 201, or 409 when running.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	timeout, err := decodeTimeout(r, false)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if !ok {
		s.mu.Unlock()
		s.notFound(w, id)
		return
	}
	if sb.state != "paused" {
		s.mu.Unlock()
		WriteError(w, http.StatusConflict, fmt.Sprintf("Sandbox %s is already running", id))
		return
	}
	finish := s.resumeLocked(sb, timeout)
	s.mu.Unlock()
	finish()
	s.mu.Lock()
	v := s.view(sb, false)
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, v)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	timeout, err := decodeTimeout(r, true)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if ok {
		sb.endAt = time.Now().Add(time.Duration(timeout) * time.Second)
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
		if end := time.Now().Add(time.Duration(body.Duration) * time.Second); end.After(sb.endAt) {
			sb.endAt = end
		}
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

func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	filter, err := metadataFilter(r)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "Error when parsing metadata: "+err.Error())
		return
	}
	s.mu.Lock()
	out := []sandboxJSON{}
	for _, sb := range s.sorted() {
		if publicState(sb.state) == "running" && matches(sb, filter) {
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
		st := publicState(sb.state)
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
