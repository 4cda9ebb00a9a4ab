package e2b

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/e2b/envdwire"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/randid"
	"github.com/esf-dev/esf/internal/rootfs"
	"github.com/esf-dev/esf/journal"
)

// EnvdVersion is the envd version the front door advertises. The SDKs
// switch features on by it (0.5.7: octet-stream uploads; 0.5.2:
// CloseStdin); older values would turn them off.
const EnvdVersion = "0.6.4"

// DefaultTimeout is a sandbox's life when create names none (the SDKs
// always send one).
const DefaultTimeout = 300 * time.Second

// MaxTimeout bounds a sandbox's timeout, as E2B's service does (24 h).
const MaxTimeout = 24 * time.Hour

// Home is the working directory and $HOME of commands: E2B's
// /home/user, made in every sandbox at creation.
const Home = "/home/user"

// RootHome is the working directory and $HOME of the user root's
// commands, made in every sandbox at creation too (a busybox image has
// none).
const RootHome = "/root"

// Options configures a Server.
type Options struct {
	// Keys are the accepted X-API-KEY values; nil accepts none.
	Keys *api.Tokens
	// Logger receives one line per control-plane call and the failures.
	Logger *slog.Logger
	// Domain is returned as the sandboxes' domain (the SDK's getHost
	// builds PORT-ID.DOMAIN from it); empty leaves it to the client.
	Domain string
	// CPUCount and MemoryMB are what get info reports of a sandbox: the
	// daemon's default container limits.
	CPUCount, MemoryMB int
	// RootUID is the host id of the containers' root when they run in a
	// user namespace (esfd --userns-range), 0 when they do not: file
	// calls act on a sandbox's root as that id.
	RootUID uint32
}

// Server is esfd's E2B-compatible front door: E2B's control plane and the
// envd protocol of every sandbox on one handler. A sandbox is a runc
// attempt of the fabric; the front door keeps only what E2B has and esf
// has not (the sandbox id, its access token, metadata, timeouts), in
// memory and as front-door records of the journal (state.go), and calls
// fabric for everything else.
type Server struct {
	f    *fabric.Fabric
	opts Options
	log  *slog.Logger
	mux  *http.ServeMux
	envd *http.ServeMux

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	snapshots map[string]snapshotRecord // by node id
	idem      map[string]*idemEntry     // by Idempotency-Key (idempotency.go)
	idemOrder []string                  // idem's keys, oldest first
	ctx       context.Context           // ends at Close: every command's parent
	cancel    context.CancelFunc
	closed    bool           // Close began: no timer starts an expiry
	wg        sync.WaitGroup // expiries running (arm)
}

// New returns the front door of f.
func New(f *fabric.Fabric, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{f: f, opts: opts, log: opts.Logger, mux: http.NewServeMux(), envd: http.NewServeMux(),
		sandboxes: map[string]*sandbox{}, snapshots: map[string]snapshotRecord{},
		idem: map[string]*idemEntry{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.routeControl()
	s.routeEnvd()
	return s
}

// Close kills every command the front door started and waits for them.
// Sandboxes (attempts) stay for the fabric's own shutdown.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// sandbox is one E2B sandbox: a live attempt, or a paused one's node.
type sandbox struct {
	id, templateID string
	metadata       map[string]string
	env            map[string]string
	startedAt      time.Time
	cpus           int
	memoryMB       int
	// op serialises the calls that change what runs (pause, connect,
	// fork, snapshot, kill).
	op sync.Mutex
	// rec serialises writing and deleting the sandbox's record (state.go),
	// so the last write describes its latest state and none follows the
	// delete.
	rec sync.Mutex

	// Guarded by Server.mu.
	gone      bool               // killed or ended: its record is deleted, never written again
	token     string             // the envd access token replies carry ("" after a restart until minted)
	tokens    [][32]byte         // SHA-256 of the accepted tokens (state.go)
	attempt   fabric.AttemptView // the live attempt (zero when paused)
	endAt     time.Time
	paused    string // the node a pause sealed
	autoPause bool
	procs     *procTable
	timer     *time.Timer // ends the sandbox at endAt
	// The CPU time at the last metrics sample, and when it was taken.
	cpuNanos uint64
	cpuAt    time.Time
}

func (sb *sandbox) state() string {
	if sb.paused != "" {
		return "paused"
	}
	return "running"
}

// ServeHTTP routes envd calls (those naming a sandbox in E2b-Sandbox-Id,
// and signed /files URLs) to the sandbox's envd and everything else to the
// control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(envdwire.HeaderSandboxID) != "" || isEnvdPath(r.URL.Path) {
		s.serveEnvd(w, r)
		return
	}
	if !s.apiKeyOK(r) {
		writeAPIError(w, http.StatusUnauthorized, "Invalid API key")
		return
	}
	s.mux.ServeHTTP(w, r)
}

func isEnvdPath(p string) bool {
	return p == "/files" || p == "/health" || strings.HasPrefix(p, "/process.") || strings.HasPrefix(p, "/filesystem.")
}

func (s *Server) apiKeyOK(r *http.Request) bool {
	if s.opts.Keys == nil {
		return false
	}
	vals := r.Header.Values("X-Api-Key")
	return len(vals) == 1 && s.opts.Keys.Valid(vals[0])
}

// apiError is the control plane's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeAPIError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, apiError{Code: status, Message: fmt.Sprintf(format, args...)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// errStatus maps a fabric error to the control plane's status.
func errStatus(err error) int {
	switch errdefs.CodeOf(err) {
	case errdefs.CodeNotFound:
		return http.StatusNotFound
	case errdefs.CodeInvalidArgument:
		return http.StatusBadRequest
	case errdefs.CodeQuotaExceeded:
		return http.StatusTooManyRequests
	case errdefs.CodeConflict, errdefs.CodeFailedPrecondition, errdefs.CodeStaleGeneration:
		return http.StatusConflict
	case errdefs.CodeUnavailable:
		return http.StatusServiceUnavailable
	case errdefs.CodeUnsupported:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

// handle registers a control-plane handler that answers with a status and
// a body (nil: none) or an error, logged once.
func (s *Server) handle(pattern string, h func(w http.ResponseWriter, r *http.Request) (int, any, error)) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		r, log := s.traced(w, r)
		status, body, err := h(w, r)
		if err != nil {
			var he *httpError
			if errors.As(err, &he) {
				status = he.status
			} else {
				status = errStatus(err)
			}
			writeAPIError(w, status, "%s", err.Error())
			log.Info("e2b request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err,
				"ms", time.Since(start).Milliseconds())
			return
		}
		if body == nil {
			w.WriteHeader(status)
		} else {
			writeJSON(w, status, body)
		}
		log.Info("e2b request", "method", r.Method, "path", r.URL.Path, "status", status, "ms", time.Since(start).Milliseconds())
	})
}

// traced gives a request the W3C trace context the /v1 API gives its
// requests (the caller's traceparent continued, or a new trace, answered
// in the traceparent header): the fabric calls it makes record the trace
// id in their events and provenance, so what an E2B session did is found
// in the event log like anything done through /v1.
func (s *Server) traced(w http.ResponseWriter, r *http.Request) (*http.Request, *slog.Logger) {
	trace, span, resp := api.ParseTraceparent(r.Header.Get("Traceparent"))
	w.Header().Set("Traceparent", resp)
	r = r.WithContext(fabric.WithCallInfo(r.Context(), fabric.CallInfo{TraceID: trace, SpanID: span}))
	return r, s.log.With("trace_id", trace)
}

// httpError is an error with the status it answers.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func httpErr(status int, format string, args ...any) error {
	return &httpError{status: status, msg: fmt.Sprintf(format, args...)}
}

func notFound(id string) error {
	return httpErr(http.StatusNotFound, "Sandbox %q doesn't exist or you don't have access to it", id)
}

func (s *Server) routeControl() {
	s.handle("POST /sandboxes", s.idempotent(s.create))
	s.handle("POST /v2/sandboxes", s.idempotent(s.create))
	s.handle("GET /sandboxes", s.list)
	s.handle("GET /v2/sandboxes", s.list)
	s.handle("GET /sandboxes/{id}", s.info)
	s.handle("DELETE /sandboxes/{id}", s.kill)
	s.handle("POST /sandboxes/{id}/timeout", s.setTimeout)
	s.handle("POST /sandboxes/{id}/refreshes", s.refresh)
	s.handle("POST /sandboxes/{id}/connect", s.connect)
	s.handle("POST /v2/sandboxes/{id}/connect", s.connect)
	s.handle("POST /sandboxes/{id}/resume", s.connect)
	s.handle("POST /sandboxes/{id}/pause", s.idempotent(s.pause))
	s.handle("GET /sandboxes/{id}/metrics", s.metrics)
	s.handle("POST /sandboxes/{id}/fork", s.idempotent(s.fork))
	s.handle("POST /sandboxes/{id}/snapshots", s.idempotent(s.snapshot))
	s.handle("GET /snapshots", s.listSnapshots)
	s.handle("DELETE /templates/{id}", s.deleteSnapshot)
	s.handle("/", func(_ http.ResponseWriter, r *http.Request) (int, any, error) {
		return 0, nil, httpErr(http.StatusNotFound, "no endpoint %s %s", r.Method, r.URL.Path)
	})
}

// decodeBody reads a JSON body of at most 1 MiB; an empty body is {}.
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		return httpErr(http.StatusBadRequest, "Error when parsing request: %v", err)
	}
	if len(b) > 1<<20 {
		return httpErr(http.StatusBadRequest, "Error when parsing request: body over 1 MiB")
	}
	if len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return httpErr(http.StatusBadRequest, "Error when parsing request: %v", err)
	}
	return nil
}

// newSandboxRequest is E2B's NewSandbox.
type newSandboxRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	AutoPause           bool              `json:"autoPause"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Network             json.RawMessage   `json:"network"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
	AutoResume          *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
}

// sandboxReply is E2B's Sandbox (create and connect).
type sandboxReply struct {
	SandboxID       string  `json:"sandboxID"`
	TemplateID      string  `json:"templateID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken"`
	Domain          *string `json:"domain"`
}

func (s *Server) reply(sb *sandbox) sandboxReply {
	s.mu.Lock()
	tok := sb.token
	s.mu.Unlock()
	r := sandboxReply{SandboxID: sb.id, TemplateID: sb.templateID, ClientID: "esf", EnvdVersion: EnvdVersion,
		EnvdAccessToken: tok}
	if s.opts.Domain != "" {
		d := s.opts.Domain
		r.Domain = &d
	}
	return r
}

// timeoutOf reads a timeout in seconds.
func timeoutOf(sec *int64) (time.Duration, error) {
	if sec == nil || *sec == 0 {
		return DefaultTimeout, nil
	}
	d := time.Duration(*sec) * time.Second
	if *sec < 0 || d > MaxTimeout {
		return 0, httpErr(http.StatusBadRequest, "Timeout cannot be greater than %d hours", int(MaxTimeout.Hours()))
	}
	return d, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var req newSandboxRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if req.AllowInternetAccess != nil && *req.AllowInternetAccess {
		return 0, nil, httpErr(http.StatusBadRequest,
			"allow_internet_access: esf sandboxes have no network access yet (loopback only): create with allowInternetAccess: false")
	}
	if len(req.Network) > 0 && string(req.Network) != "null" {
		return 0, nil, httpErr(http.StatusBadRequest, "network: esf sandboxes have no network policy yet")
	}
	if len(req.VolumeMounts) > 0 && string(req.VolumeMounts) != "null" && string(req.VolumeMounts) != "[]" {
		return 0, nil, httpErr(http.StatusBadRequest, "volumeMounts are not supported by esf")
	}
	ttl, err := timeoutOf(req.Timeout)
	if err != nil {
		return 0, nil, err
	}
	if err := checkVarsSize(req.Metadata, req.EnvVars); err != nil {
		return 0, nil, err
	}
	nodeID, err := s.template(r.Context(), req.TemplateID)
	if err != nil {
		return 0, nil, err
	}
	sb := &sandbox{id: sandboxIDFor(r.Context(), 0), templateID: req.TemplateID, metadata: req.Metadata,
		env: req.EnvVars, autoPause: req.AutoPause}
	sb.setToken(newToken())
	if sb.metadata == nil {
		sb.metadata = map[string]string{}
	}
	s.mu.Lock()
	_, taken := s.sandboxes[sb.id]
	s.mu.Unlock()
	if taken { // a key reused after the front door forgot its first answer
		return 0, nil, httpErr(http.StatusConflict, "%s already made sandbox %s", HeaderIdempotencyKey, sb.id)
	}
	if err := s.start(withStep(r.Context(), "activate"), sb, nodeID, ttl); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, s.reply(sb), nil
}

// maxVarsBytes bounds a sandbox's metadata and envVars together, as JSON:
// they are kept in its record (state.go), which the fabric bounds to 256
// KiB, and a create refused only when it records the sandbox would have
// started a container for nothing.
const maxVarsBytes = 192 << 10

func checkVarsSize(metadata, env map[string]string) error {
	m, err := json.Marshal(metadata)
	if err != nil {
		return httpErr(http.StatusBadRequest, "metadata: %v", err)
	}
	e, err := json.Marshal(env)
	if err != nil {
		return httpErr(http.StatusBadRequest, "envVars: %v", err)
	}
	if n := len(m) + len(e); n > maxVarsBytes {
		return httpErr(http.StatusBadRequest, "metadata and envVars: %d bytes of JSON, at most %d", n, maxVarsBytes)
	}
	return nil
}

// template resolves a templateID to the node a sandbox starts from: a
// group by name or id (its canonical node), a node, or a snapshot (a
// node).
func (s *Server) template(ctx context.Context, id string) (string, error) {
	kind, err := journal.KindOf(id)
	if err != nil && journal.CheckGroupName(id) == nil {
		g, err := s.f.GroupByName(ctx, id)
		if err != nil {
			if errdefs.CodeOf(err) == errdefs.CodeNotFound {
				return "", httpErr(http.StatusNotFound, "template %q not found: no group has that name", id)
			}
			return "", err
		}
		return g.CanonicalNodeID, nil
	}
	if err != nil || (kind != journal.KindGroup && kind != journal.KindNode) {
		return "", httpErr(http.StatusNotFound, "template %q not found: want a group name or id, a node id or a snapshot id", id)
	}
	in, err := s.f.Inspect(ctx, id)
	if err != nil {
		if errdefs.CodeOf(err) == errdefs.CodeNotFound {
			return "", httpErr(http.StatusNotFound, "template %q not found", id)
		}
		return "", err
	}
	if in.Group != nil {
		return in.Group.CanonicalNodeID, nil
	}
	if in.Node.Status == journal.NodePruned {
		return "", httpErr(http.StatusNotFound, "template %q not found (pruned)", id)
	}
	return id, nil
}

// Labels of a sandbox's attempts: what the provenance of every node they
// seal (pause, snapshot, fork) keeps of the E2B call.
const (
	LabelSandboxID = "e2b.sandbox_id"
	LabelTemplate  = "e2b.template_id"
	// LabelEnvKeys lists the envVars' names, comma-separated; their values
	// (often secrets) are never recorded.
	LabelEnvKeys = "e2b.env_keys"
	// LabelMetadata prefixes each metadata key.
	LabelMetadata = "metadata."
)

// labels gives sb's attempt labels: its id, template, metadata and the
// names (not values) of its envVars.
func labels(sb *sandbox) map[string]string {
	l := map[string]string{LabelSandboxID: sb.id, LabelTemplate: sb.templateID}
	for k, v := range sb.metadata {
		l[LabelMetadata+k] = v
	}
	if len(sb.env) > 0 {
		keys := make([]string, 0, len(sb.env))
		for k := range sb.env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		l[LabelEnvKeys] = strings.Join(keys, ",")
	}
	return l
}

// start activates a runc attempt of nodeID for sb, with a lease of ttl,
// makes E2B's home directory in it and registers sb.
func (s *Server) start(ctx context.Context, sb *sandbox, nodeID string, ttl time.Duration) error {
	env := make([]string, 0, len(sb.env))
	for k, v := range sb.env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	a, err := s.f.Activate(ctx, fabric.ActivateRequest{NodeID: nodeID, Executor: fabric.ExecutorRunc,
		TTLMillis: (ttl + leaseSlack).Milliseconds(), Env: env, NoQueue: true, Labels: labels(sb)})
	if err != nil {
		return err
	}
	if keyFrom(ctx) != "" {
		// Under a caller's key the fabric answers a retry with the first
		// activation's recorded answer, which says "active" even when
		// that attempt has ended since (its sandbox was killed, or the
		// first call failed after activating and released it): only a
		// live attempt is a sandbox.
		in, err := s.f.Inspect(ctx, a.AttemptID)
		if err != nil {
			return err
		}
		if !in.Attempt.State.Live() {
			return httpErr(http.StatusConflict, "%s %q: its sandbox %s ended (attempt %s is %s): use a new key",
				HeaderIdempotencyKey, keyFrom(ctx), sb.id, a.AttemptID, in.Attempt.State)
		}
	}
	if err := s.makeHome(a.Root); err != nil {
		s.releaseFailed(ctx, a.AttemptID)
		return err
	}
	now := time.Now()
	s.mu.Lock()
	prev := struct {
		attempt fabric.AttemptView
		paused  string
		endAt   time.Time
	}{sb.attempt, sb.paused, sb.endAt}
	sb.attempt, sb.paused, sb.endAt = a, "", now.Add(ttl)
	if sb.startedAt.IsZero() {
		sb.startedAt = now
	}
	s.mu.Unlock()
	// Recorded before it is served: a sandbox an SDK holds survives a
	// restart.
	if err := s.persist(ctx, sb); err != nil {
		s.releaseFailed(ctx, a.AttemptID)
		s.mu.Lock()
		sb.attempt, sb.paused, sb.endAt = prev.attempt, prev.paused, prev.endAt
		s.mu.Unlock()
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb.procs = newProcTable(s.ctx)
	s.arm(sb)
	sb.cpus, sb.memoryMB = max(s.opts.CPUCount, 1), s.opts.MemoryMB
	s.sandboxes[sb.id] = sb
	return nil
}

// releaseFailed releases the attempt of a sandbox that could not be made
// (start failed after the activation). Under a caller's key the release
// carries its own key, derived from the activation's: it is another
// operation, and the activation's key would make the fabric refuse it
// (the attempt would then live on until its lease ran out).
func (s *Server) releaseFailed(ctx context.Context, attemptID string) {
	ctx = context.WithoutCancel(ctx)
	if ci, ok := fabric.CallInfoFrom(ctx); ok && ci.IdempotencyKey != "" && !ci.KeyGenerated {
		ci.IdempotencyKey += "-release"
		ctx = fabric.WithCallInfo(ctx, ci)
	}
	if _, err := s.f.Release(ctx, fabric.ReleaseRequest{AttemptID: attemptID}); err != nil {
		s.log.Warn("e2b: release the attempt of a sandbox that failed to start", "attempt", attemptID, "err", err)
	}
}

func (s *Server) makeHome(root string) error {
	r, err := rootfs.Open(root, rootfs.Options{})
	if err != nil {
		return err
	}
	defer r.Close()
	return asSandboxRoot(s.opts.RootUID, func() error {
		// The homes of the SDKs' two users: their commands start there.
		for _, d := range []struct {
			path string
			mode uint32
		}{{Home, 0o755}, {RootHome, 0o700}} {
			fd, err := r.MkdirAll(d.path, d.mode)
			if err != nil {
				return fmt.Errorf("make %s: %w", d.path, err)
			}
			if err := closeFD(fd); err != nil {
				return err
			}
		}
		return nil
	})
}

// newToken draws an envd access token.
func newToken() string { return randid.Hex(32) }

var sandboxIDEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newSandboxID draws an id in E2B's style: "i" and 20 lower-case letters
// and digits.
func newSandboxID() string {
	var b [13]byte
	rand.Read(b[:])
	return "i" + sandboxIDEncoding.EncodeToString(b[:])[:20]
}

// lookup returns the sandbox id names, dropping it if its attempt ended
// behind the front door's back (its lease expired, it failed).
func (s *Server) lookup(ctx context.Context, id string) (*sandbox, error) {
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	var attemptID string
	if ok && sb.paused == "" {
		attemptID = sb.attempt.AttemptID
	}
	s.mu.Unlock()
	if !ok {
		return nil, notFound(id)
	}
	if attemptID == "" {
		return sb, nil
	}
	in, err := s.f.Inspect(ctx, attemptID)
	if err != nil && errdefs.CodeOf(err) != errdefs.CodeNotFound {
		return nil, err
	}
	if err == nil && in.Attempt.State.Live() {
		return sb, nil
	}
	// The attempt ended: by a pause or fork under way (wait for it), or
	// behind the front door's back.
	sb.op.Lock()
	defer sb.op.Unlock()
	s.mu.Lock()
	if cur := s.sandboxes[id]; cur != sb {
		s.mu.Unlock()
		return nil, notFound(id)
	}
	if sb.paused != "" || sb.attempt.AttemptID != attemptID {
		s.mu.Unlock()
		return sb, nil // paused or resumed meanwhile
	}
	delete(s.sandboxes, id)
	sb.gone = true
	if sb.timer != nil {
		sb.timer.Stop()
	}
	procs := sb.procs
	s.mu.Unlock()
	procs.killAll()
	s.forgetSandbox(ctx, sb)
	return nil, notFound(id)
}

// sandboxDetail is E2B's SandboxDetail and ListedSandbox.
type sandboxDetail struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	ClientID    string            `json:"clientID"`
	Alias       *string           `json:"alias,omitempty"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	State       string            `json:"state"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	EnvdVersion string            `json:"envdVersion"`
	// Detail only.
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain,omitempty"`
	Lifecycle       *struct {
		OnTimeout  string `json:"onTimeout"`
		AutoResume bool   `json:"autoResume"`
	} `json:"lifecycle,omitempty"`
}

// detail describes sb; caller holds s.mu.
func (s *Server) detail(sb *sandbox) sandboxDetail {
	d := sandboxDetail{SandboxID: sb.id, TemplateID: sb.templateID, ClientID: "esf", StartedAt: sb.startedAt.UTC(),
		EndAt: sb.endAt.UTC(), State: sb.state(), CPUCount: sb.cpus, MemoryMB: sb.memoryMB, Metadata: sb.metadata,
		EnvdVersion: EnvdVersion}
	return d
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) (int, any, error) {
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if err := s.ensureToken(r.Context(), sb); err != nil {
		return 0, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.detail(sb)
	d.EnvdAccessToken = sb.token
	if s.opts.Domain != "" {
		dom := s.opts.Domain
		d.Domain = &dom
	}
	onTimeout := "kill"
	if sb.autoPause {
		onTimeout = "pause"
	}
	d.Lifecycle = &struct {
		OnTimeout  string `json:"onTimeout"`
		AutoResume bool   `json:"autoResume"`
	}{OnTimeout: onTimeout}
	return http.StatusOK, d, nil
}

// maxListLimit bounds a page of list.
const maxListLimit = 1000

func (s *Server) list(w http.ResponseWriter, r *http.Request) (int, any, error) {
	q := r.URL.Query()
	var meta url.Values
	if m := q.Get("metadata"); m != "" {
		var err error
		if meta, err = url.ParseQuery(m); err != nil {
			return 0, nil, httpErr(http.StatusBadRequest, "metadata %q: %v", m, err)
		}
	}
	// v1 lists the running sandboxes; v2 every state unless filtered.
	states := map[string]bool{"running": true, "paused": strings.HasPrefix(r.URL.Path, "/v2/")}
	if st := q.Get("state"); st != "" {
		states = map[string]bool{}
		for _, v := range strings.Split(st, ",") {
			if v != "running" && v != "paused" {
				return 0, nil, httpErr(http.StatusBadRequest, "state %q: want running or paused", v)
			}
			states[v] = true
		}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListLimit {
			return 0, nil, httpErr(http.StatusBadRequest, "limit %q: want 1..%d", l, maxListLimit)
		}
		limit = n
	}
	after := q.Get("nextToken")

	// Check every running sandbox's attempt first, so that expired ones
	// are not listed.
	s.mu.Lock()
	ids := make([]string, 0, len(s.sandboxes))
	for id := range s.sandboxes {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.lookup(r.Context(), id)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	ids = ids[:0]
	for id := range s.sandboxes {
		if id > after {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := []sandboxDetail{}
	for _, id := range ids {
		sb := s.sandboxes[id]
		if !states[sb.state()] || !metaMatch(sb.metadata, meta) {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", out[len(out)-1].SandboxID)
			break
		}
		out = append(out, s.detail(sb))
	}
	return http.StatusOK, out, nil
}

func metaMatch(m map[string]string, want url.Values) bool {
	for k, vs := range want {
		for _, v := range vs {
			if m[k] != v {
				return false
			}
		}
	}
	return true
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) (int, any, error) {
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	if err := s.killLocked(context.WithoutCancel(r.Context()), sb); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// killLocked forgets sb and releases its attempt (unsealed work is
// dropped; a paused sandbox's node stays). Caller holds sb.op.
func (s *Server) killLocked(ctx context.Context, sb *sandbox) error {
	s.mu.Lock()
	if s.sandboxes[sb.id] != sb {
		s.mu.Unlock()
		return notFound(sb.id)
	}
	delete(s.sandboxes, sb.id)
	sb.gone = true
	if sb.timer != nil {
		sb.timer.Stop()
	}
	attemptID := ""
	if sb.paused == "" {
		attemptID = sb.attempt.AttemptID
	}
	procs := sb.procs
	s.mu.Unlock()
	if procs != nil {
		procs.killAll()
	}
	// Forgotten first: a sandbox killed is gone even if the release
	// fails (its lease then runs out).
	s.forgetSandbox(ctx, sb)
	if attemptID != "" {
		if _, err := s.f.Release(ctx, fabric.ReleaseRequest{AttemptID: attemptID}); err != nil {
			return err
		}
	}
	return nil
}

type timeoutRequest struct {
	Timeout  *int64 `json:"timeout"`
	Duration *int64 `json:"duration"`
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var req timeoutRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if req.Timeout == nil {
		return 0, nil, httpErr(http.StatusBadRequest, "timeout is required")
	}
	return s.renew(w, r, req.Timeout)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var req timeoutRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	return s.renew(w, r, req.Duration)
}

// renew sets a running sandbox's lease to end timeout seconds from now.
func (s *Server) renew(_ http.ResponseWriter, r *http.Request, sec *int64) (int, any, error) {
	ttl, err := timeoutOf(sec)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if err := s.renewLease(r.Context(), sb, ttl); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

func (s *Server) renewLease(ctx context.Context, sb *sandbox, ttl time.Duration) error {
	s.mu.Lock()
	a, paused := sb.attempt, sb.paused != ""
	s.mu.Unlock()
	if paused {
		return httpErr(http.StatusConflict, "Sandbox %q is paused", sb.id)
	}
	if a.Lease == nil {
		return httpErr(http.StatusConflict, "Sandbox %q has no lease", sb.id)
	}
	if _, err := s.f.Renew(ctx, fabric.RenewRequest{LeaseID: a.Lease.LeaseID, Token: a.Lease.Token,
		TTLMillis: (ttl + leaseSlack).Milliseconds()}); err != nil {
		return err
	}
	s.mu.Lock()
	sb.endAt = time.Now().Add(ttl)
	s.arm(sb)
	s.mu.Unlock()
	s.persistLogged(ctx, sb)
	return nil
}

type connectRequest struct {
	Timeout *int64 `json:"timeout"`
	Memory  *bool  `json:"memory"`
}

// connect attaches to a running sandbox (200) or resumes a paused one by
// activating its node again under the same id (201).
func (s *Server) connect(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var req connectRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if req.Memory != nil && *req.Memory {
		return 0, nil, errMemory
	}
	ttl, err := timeoutOf(req.Timeout)
	if err != nil {
		return 0, nil, err
	}
	sb, err := s.lookup(r.Context(), r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	if err := s.ensureToken(r.Context(), sb); err != nil {
		return 0, nil, err
	}
	s.mu.Lock()
	paused, endAt := sb.paused, sb.endAt
	s.mu.Unlock()
	if paused == "" {
		// E2B extends a running sandbox's life to at least the timeout.
		if time.Until(endAt) < ttl {
			if err := s.renewLease(r.Context(), sb, ttl); err != nil {
				return 0, nil, err
			}
		}
		return http.StatusOK, s.reply(sb), nil
	}
	return s.resume(r.Context(), sb, ttl)
}

// errMemory refuses memory snapshots.
var errMemory = httpErr(http.StatusBadRequest,
	"memory: esf checkpoints files and logical state, not process memory: pause and resume without keepMemory")
