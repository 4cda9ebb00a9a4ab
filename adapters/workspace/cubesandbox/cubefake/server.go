package cubefake

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b/e2bfake"
	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// Options shapes a Server.
type Options struct {
	// APIKey, when set, must arrive as a Bearer token or X-API-Key.
	APIKey string
	// Domain is CubeProxy's sandbox domain, default "cube.app".
	Domain string
	// EnvdVersion is reported for every sandbox, default "0.6.13".
	EnvdVersion string
	// Templates, when set, are the only template ids create accepts.
	Templates []string
	// Dir holds one directory per sandbox; default a temporary directory.
	Dir string
	// CreateDelay is how long create takes after the sandbox exists.
	CreateDelay time.Duration
	// PauseDelay is how long a sandbox stays "pausing" after pause
	// answered 204; ResumeDelay how long connect takes to resume.
	PauseDelay, ResumeDelay time.Duration
	// TrafficToken gives sandboxes a traffic token that CubeProxy then
	// requires in cube-traffic-access-token.
	TrafficToken bool
}

// Server is an offline CubeSandbox.
type Server struct {
	URL  string
	opts Options
	ts   *httptest.Server
	api  *http.ServeMux
	own  bool

	mu        sync.Mutex
	closed    bool
	sandboxes map[string]*sandbox
	limited   int
	calls     map[string]int
	timers    sync.WaitGroup
}

type sandbox struct {
	id, template   string
	state          string // running, pausing, paused, resuming
	dir            string
	envd           *e2bfake.Envd
	token, traffic string
	metadata       map[string]string
	startedAt      time.Time
	endAt          time.Time // zero: never
}

// New starts a Server.
func New(opts Options) (*Server, error) {
	if opts.Domain == "" {
		opts.Domain = "cube.app"
	}
	if opts.EnvdVersion == "" {
		opts.EnvdVersion = "0.6.13"
	}
	s := &Server{opts: opts, sandboxes: map[string]*sandbox{}, calls: map[string]int{}}
	if s.opts.Dir == "" {
		d, err := os.MkdirTemp("", "cubefake-")
		if err != nil {
			return nil, err
		}
		s.opts.Dir, s.own = d, true
	}
	mux := http.NewServeMux()
	for _, prefix := range []string{"", "/cubeapi/v1"} {
		mux.HandleFunc("POST "+prefix+"/sandboxes", s.create)
		mux.HandleFunc("GET "+prefix+"/sandboxes", s.list)
		mux.HandleFunc("GET "+prefix+"/v2/sandboxes", s.list)
		mux.HandleFunc("GET "+prefix+"/sandboxes/{id}", s.get)
		mux.HandleFunc("DELETE "+prefix+"/sandboxes/{id}", s.kill)
		mux.HandleFunc("POST "+prefix+"/sandboxes/{id}/pause", s.pause)
		mux.HandleFunc("POST "+prefix+"/sandboxes/{id}/connect", s.connect)
		mux.HandleFunc("POST "+prefix+"/sandboxes/{id}/resume", s.connect)
		mux.HandleFunc("POST "+prefix+"/sandboxes/{id}/timeout", s.setTimeout)
		mux.HandleFunc("POST "+prefix+"/sandboxes/{id}/refreshes", s.refresh)
		mux.HandleFunc("GET "+prefix+"/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	}
	s.api = mux
	s.ts = httptest.NewServer(s)
	s.URL = s.ts.URL
	return s, nil
}

// Addr is the listener's host:port: the "node IP" to dial.
func (s *Server) Addr() string { return s.ts.Listener.Addr().String() }

// Close stops the server and destroys every sandbox.
func (s *Server) Close() {
	s.ts.Close()
	s.mu.Lock()
	s.closed = true
	all := s.sandboxes
	s.sandboxes = map[string]*sandbox{}
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

// Count is the number of live sandboxes.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reapLocked()
	return len(s.sandboxes)
}

// Processes counts processes running in all sandboxes.
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

// RateLimit makes the next n control-plane requests answer 429 (CubeAPI's
// limiter sends no Retry-After).
func (s *Server) RateLimit(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limited = n
}

// Calls counts requests served for a route pattern, e.g.
// "POST /sandboxes/{id}/pause".
func (s *Server) Calls(pattern string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[pattern]
}

// Kill destroys a sandbox behind the clients' backs.
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

// destroy stops a sandbox already out of the table; one whose envd still
// boots is stopped by create when the boot ends.
func (s *Server) destroy(sb *sandbox) {
	s.mu.Lock()
	e := sb.envd
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
	_ = os.RemoveAll(sb.dir)
}

func (s *Server) reapLocked() {
	now := time.Now()
	for id, sb := range s.sandboxes {
		if sb.state == "running" && !sb.endAt.IsZero() && now.After(sb.endAt) {
			delete(s.sandboxes, id)
			go s.destroy(sb)
		}
	}
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok := e2bfake.HostRoute(r.Host, s.opts.Domain); ok {
		s.proxy(w, r, id, port)
		return
	}
	_, pattern := s.api.Handler(r)
	pattern = strings.Replace(pattern, "/cubeapi/v1", "", 1)
	s.mu.Lock()
	s.calls[pattern]++
	s.reapLocked()
	limited := s.limited > 0
	if limited {
		s.limited--
	}
	s.mu.Unlock()
	if s.opts.APIKey != "" {
		tok, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !(bearer && tok == s.opts.APIKey) && r.Header.Get("X-API-Key") != s.opts.APIKey {
			e2bfake.WriteError(w, http.StatusUnauthorized, "unauthorized")
			return
		}
	}
	if limited {
		e2bfake.WriteError(w, http.StatusTooManyRequests, "too many requests")
		return
	}
	s.api.ServeHTTP(w, r)
}

func (s *Server) proxy(w http.ResponseWriter, r *http.Request, id string, port int) {
	s.mu.Lock()
	s.reapLocked()
	sb, ok := s.sandboxes[id]
	var e *e2bfake.Envd
	if ok && sb.state == "running" {
		e = sb.envd
	}
	s.mu.Unlock()
	if e == nil || port != envd.DefaultPort {
		e2bfake.WriteError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s not found", id))
		return
	}
	if sb.traffic != "" && r.Header.Get(envd.TrafficTokenCube) != sb.traffic {
		e2bfake.WriteError(w, http.StatusForbidden, "invalid traffic access token")
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

type sandboxJSON struct {
	TemplateID         string            `json:"templateID"`
	SandboxID          string            `json:"sandboxID"`
	ClientID           string            `json:"clientID"`
	EnvdVersion        string            `json:"envdVersion"`
	EnvdAccessToken    *string           `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string           `json:"trafficAccessToken,omitempty"`
	Domain             *string           `json:"domain,omitempty"`
	StartedAt          string            `json:"startedAt,omitempty"`
	EndAt              string            `json:"endAt,omitempty"`
	CPUCount           int               `json:"cpuCount,omitempty"`
	MemoryMB           int               `json:"memoryMB,omitempty"`
	State              string            `json:"state,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
}

func (s *Server) view(sb *sandbox, info bool) sandboxJSON {
	v := sandboxJSON{TemplateID: sb.template, SandboxID: sb.id, ClientID: "cube", EnvdVersion: s.opts.EnvdVersion}
	if sb.token != "" {
		t := sb.token
		v.EnvdAccessToken = &t
	}
	if sb.traffic != "" {
		t := sb.traffic
		v.TrafficAccessToken = &t
	}
	if info {
		v.StartedAt = sb.startedAt.UTC().Format(time.RFC3339)
		if !sb.endAt.IsZero() {
			v.EndAt = sb.endAt.UTC().Format(time.RFC3339)
		}
		v.CPUCount, v.MemoryMB = 2, 2048
		v.State = sb.state
		if v.State == "resuming" {
			v.State = "paused"
		}
		v.Metadata = sb.metadata
	}
	return v
}

func notFound(w http.ResponseWriter, id string) {
	e2bfake.WriteError(w, http.StatusNotFound, fmt.Sprintf("sandbox %s not found", id))
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var body struct {
		TemplateID string            `json:"templateID"`
		Timeout    *int              `json:"timeout"`
		Secure     *bool             `json:"secure"`
		Metadata   map[string]string `json:"metadata"`
		EnvVars    map[string]string `json:"envVars"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		e2bfake.WriteError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return
	}
	if body.TemplateID == "" {
		e2bfake.WriteError(w, http.StatusBadRequest, "templateID is required")
		return
	}
	if len(s.opts.Templates) > 0 && !contains(s.opts.Templates, body.TemplateID) {
		e2bfake.WriteError(w, http.StatusNotFound, fmt.Sprintf("template %s not found", body.TemplateID))
		return
	}
	sb := &sandbox{id: randomHex(12), template: body.TemplateID, state: "running", metadata: body.Metadata, startedAt: time.Now()}
	timeout := 300
	if body.Timeout != nil {
		timeout = *body.Timeout
	}
	if timeout >= 0 {
		sb.endAt = sb.startedAt.Add(time.Duration(timeout) * time.Second)
	}
	if body.Secure == nil || *body.Secure {
		sb.token = randomHex(16)
	}
	if s.opts.TrafficToken {
		sb.traffic = randomHex(16)
	}
	sb.dir = filepath.Join(s.opts.Dir, sb.id)
	// Listed from here on, while envd boots.
	s.mu.Lock()
	s.sandboxes[sb.id] = sb
	s.mu.Unlock()
	e, err := e2bfake.NewEnvd(e2bfake.EnvdOptions{Root: sb.dir, User: "root", Home: "/root", AccessToken: sb.token, Env: body.EnvVars})
	if err != nil {
		s.Kill(sb.id)
		e2bfake.WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	s.mu.Lock()
	killed := s.sandboxes[sb.id] != sb
	sb.envd = e
	s.mu.Unlock()
	if killed {
		s.destroy(sb)
	}
	time.Sleep(s.opts.CreateDelay)
	s.mu.Lock()
	v := s.view(sb, false)
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, v)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
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
		notFound(w, id)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.Kill(id) {
		notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pause answers at once; the sandbox becomes paused after PauseDelay.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		notFound(w, id)
		return
	}
	if sb.state != "running" {
		e2bfake.WriteError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is %s", id, sb.state))
		return
	}
	sb.state = "pausing"
	e := sb.envd
	s.timers.Add(1)
	go func() {
		defer s.timers.Done()
		if e != nil {
			e.KillAll()
		}
		time.Sleep(s.opts.PauseDelay)
		s.mu.Lock()
		if !s.closed && sb.state == "pausing" {
			sb.state = "paused"
		}
		s.mu.Unlock()
	}()
	w.WriteHeader(http.StatusNoContent)
}

// connect answers 200 whether the sandbox was running or had to be
// resumed; the body may be {} or carry a timeout.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var body struct {
		Timeout *int `json:"timeout"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if !ok {
		s.mu.Unlock()
		notFound(w, id)
		return
	}
	switch sb.state {
	case "running":
	case "paused":
		sb.state = "resuming"
		s.mu.Unlock()
		time.Sleep(s.opts.ResumeDelay)
		s.mu.Lock()
		sb.state = "running"
	default:
		st := sb.state
		s.mu.Unlock()
		e2bfake.WriteError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is %s", id, st))
		return
	}
	if body.Timeout != nil && *body.Timeout > 0 {
		if end := time.Now().Add(time.Duration(*body.Timeout) * time.Second); !sb.endAt.IsZero() && end.After(sb.endAt) {
			sb.endAt = end
		}
	}
	v := s.view(sb, false)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, v)
}

// setTimeout: 0 expires the sandbox now, -1 never.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var body struct {
		Timeout *int `json:"timeout"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Timeout == nil {
		e2bfake.WriteError(w, http.StatusBadRequest, "timeout is required")
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if ok {
		switch t := *body.Timeout; {
		case t < 0:
			sb.endAt = time.Time{}
		default:
			sb.endAt = time.Now().Add(time.Duration(t) * time.Second)
		}
	}
	s.mu.Unlock()
	if !ok {
		notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	_, ok := s.sandboxes[id]
	s.mu.Unlock()
	if !ok {
		notFound(w, id)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// list ignores every filter and page parameter.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	out := []sandboxJSON{}
	for _, sb := range s.sandboxes {
		out = append(out, s.view(sb, true))
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].SandboxID < out[j].SandboxID })
	writeJSON(w, http.StatusOK, out)
}
