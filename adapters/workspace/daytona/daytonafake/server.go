package daytonafake

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options shapes a fake. The zero value accepts any bearer token.
type Options struct {
	// APIKey is the bearer token accepted as an API key.
	APIKey string
	// JWT is the bearer token accepted together with an
	// X-Daytona-Organization-ID header equal to OrganizationID.
	JWT, OrganizationID string
	// Transition is how long each asynchronous state step takes
	// (creating->started, stopping->stopped, ...). Default 20ms.
	Transition time.Duration
	// SandboxClass is reported for every sandbox: "container" (default)
	// refuses pause with 422 like Daytona; "linux-vm" pauses.
	SandboxClass string
	// Snapshots, when not nil, are the only snapshot names create accepts;
	// others fail with Daytona's 400.
	Snapshots []string
	// FailImages are snapshot names or images whose sandboxes end in the
	// "error" (snapshot) or "build_failed" (image) state.
	FailImages []string
	// Dir holds the sandboxes' roots; default a temporary directory that
	// Close removes.
	Dir string
	// PageSize, when positive, caps the list page size below Daytona's 200
	// so pagination can be tested.
	PageSize int
}

// Server is a running fake: the API under URL() and the toolbox proxy under
// ToolboxURL(). Close it.
type Server struct {
	opts   Options
	ts     *httptest.Server
	dir    string
	ownDir bool

	mu            sync.Mutex
	sandboxes     map[string]*sandbox
	throttleN     int
	throttleAfter time.Duration
	throttlePaths []string
	throttled     int
	closed        bool

	procs sync.WaitGroup // every process the fake started
}

// New starts a fake.
func New(opts Options) (*Server, error) {
	if opts.Transition <= 0 {
		opts.Transition = 20 * time.Millisecond
	}
	if opts.SandboxClass == "" {
		opts.SandboxClass = "container"
	}
	s := &Server{opts: opts, sandboxes: map[string]*sandbox{}}
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "daytonafake-")
		if err != nil {
			return nil, err
		}
		s.dir, s.ownDir = d, true
	} else {
		d, err := filepath.Abs(opts.Dir)
		if err != nil {
			return nil, err
		}
		s.dir = d
	}
	// Sandbox paths are host paths; resolve symlinks (macOS /tmp, bind
	// mounts) so the paths the toolbox reports match what `pwd` prints.
	if d, err := filepath.EvalSymlinks(s.dir); err == nil {
		s.dir = d
	}
	if err := probe(filepath.Join(s.dir, ".probe")); err != nil {
		if s.ownDir {
			os.RemoveAll(s.dir)
		}
		return nil, err
	}
	mux := http.NewServeMux()
	s.routes(mux)
	s.ts = httptest.NewServer(s.middleware(mux))
	return s, nil
}

// URL is the API base URL (what Daytona serves at https://app.daytona.io/api).
func (s *Server) URL() string { return s.ts.URL + "/api" }

// ToolboxURL is the toolbox proxy base; a sandbox's toolbox lives at
// ToolboxURL()/{id}.
func (s *Server) ToolboxURL() string { return s.ts.URL + "/toolbox" }

// Close kills every process, stops the server and removes the sandboxes.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for _, sb := range s.sandboxes {
		sb.stopTimers()
		sb.killAll()
	}
	s.mu.Unlock()
	s.ts.Close()
	s.mu.Lock()
	for _, sb := range s.sandboxes {
		s.reap(sb)
	}
	s.mu.Unlock()
	s.procs.Wait()
	if s.ownDir {
		os.RemoveAll(s.dir)
	}
}

// Live counts sandboxes that exist and are not being destroyed: what a
// leak check wants to see return to its starting value.
func (s *Server) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sb := range s.sandboxes {
		if sb.live() {
			n++
		}
	}
	return n
}

// Processes counts commands running in any sandbox (process/execute and
// session commands).
func (s *Server) Processes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sb := range s.sandboxes {
		n += len(sb.procs)
	}
	return n
}

// ToolboxSessions counts open toolbox process sessions across sandboxes.
func (s *Server) ToolboxSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sb := range s.sandboxes {
		n += len(sb.sessions)
	}
	return n
}

// Throttle answers the next n requests (API or toolbox) with 429 and a
// Retry-After of retryAfter, rounded up to whole seconds as Daytona sends it.
// With paths, only requests whose URL path contains one of them count.
func (s *Server) Throttle(n int, retryAfter time.Duration, paths ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttleN, s.throttleAfter, s.throttlePaths = n, retryAfter, paths
}

func (s *Server) throttles(r *http.Request) bool {
	if s.throttleN <= 0 {
		return false
	}
	if len(s.throttlePaths) == 0 {
		return true
	}
	for _, p := range s.throttlePaths {
		if strings.Contains(r.URL.Path, p) {
			return true
		}
	}
	return false
}

// Throttled is how many requests were refused with 429 so far.
func (s *Server) Throttled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.throttled
}

// Sandbox is what a test may inspect of a fake sandbox.
type Sandbox struct {
	ID, Name, Snapshot, Image, Target string
	State, DesiredState               string
	Env, Labels                       map[string]string
	AutoStopInterval, TTLMinutes      int
	// Root is the host directory holding the sandbox's /home and /tmp.
	Root string
}

// Inspect reports a sandbox that is not yet destroyed.
func (s *Server) Inspect(id string) (Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	if sb == nil {
		return Sandbox{}, false
	}
	return Sandbox{
		ID: sb.id, Name: sb.name, Snapshot: sb.snapshot, Image: sb.image, Target: sb.target,
		State: sb.state, DesiredState: sb.desired, Env: cloneMap(sb.env), Labels: cloneMap(sb.labels),
		AutoStopInterval: sb.autoStop, TTLMinutes: sb.ttl, Root: sb.root,
	}, true
}

func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		toolbox := strings.HasPrefix(r.URL.Path, "/toolbox/")
		if !s.authorized(r) {
			if toolbox {
				daemonError(w, r, http.StatusUnauthorized, "UNAUTHORIZED", "authentication failed: Bearer token is invalid")
			} else {
				apiError(w, r, http.StatusUnauthorized, "Unauthorized")
			}
			return
		}
		s.mu.Lock()
		if s.throttles(r) {
			s.throttleN--
			s.throttled++
			after := int(math.Ceil(s.throttleAfter.Seconds()))
			s.mu.Unlock()
			w.Header().Set("Retry-After", strconv.Itoa(after))
			apiError(w, r, http.StatusTooManyRequests, "ThrottlerException: Too Many Requests")
			return
		}
		s.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

func (s *Server) authorized(r *http.Request) bool {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return false
	}
	if s.opts.APIKey == "" && s.opts.JWT == "" {
		return true
	}
	if s.opts.APIKey != "" && tok == s.opts.APIKey {
		return true
	}
	return s.opts.JWT != "" && tok == s.opts.JWT &&
		r.Header.Get("X-Daytona-Organization-ID") == s.opts.OrganizationID
}

// apiError writes the body of Daytona's NestJS all-exceptions filter.
func apiError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	writeJSON(w, status, map[string]any{
		"path":       r.URL.RequestURI(),
		"timestamp":  time.Now().UTC().Format(time.RFC3339Nano),
		"statusCode": status,
		"error":      http.StatusText(status),
		"message":    msg,
	})
}

// daemonError writes the body of the daemon/runner/proxy error middleware
// (common-go ErrorResponse).
func daemonError(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	writeJSON(w, status, map[string]any{
		"statusCode": status,
		"message":    msg,
		"code":       code,
		"timestamp":  time.Now().UTC().Format(time.RFC3339Nano),
		"path":       r.URL.Path,
		"method":     r.Method,
	})
}

// abort is gin's AbortWithError as the daemon's file handlers use it: the
// status is written at once, so the error middleware adds no body.
func abort(w http.ResponseWriter, status int) { w.WriteHeader(status) }

// abortFor maps an OS error the way the daemon's file handlers do.
func abortFor(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, os.ErrNotExist):
		abort(w, http.StatusNotFound)
	case errors.Is(err, os.ErrPermission):
		abort(w, http.StatusForbidden)
	default:
		abort(w, http.StatusBadRequest)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return fmt.Sprintf("%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}
