package daytonafake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sandbox is one fake sandbox. Every field is guarded by Server.mu except
// the immutable id, root (its host directory), home (a sandbox path) and
// env.
type sandbox struct {
	id, root, home string

	name, user, snapshot, image, target, class string
	env, labels                                map[string]string
	state, desired                             string
	pending                                    bool
	errorReason                                string
	autoStop, autoArchive                      int
	autoDelete                                 *int
	ttl                                        int
	createdAt, updatedAt                       time.Time

	timers   []*time.Timer
	sessions map[string]*tsession
	procs    map[*proc]struct{}

	nsOnce sync.Once // starts ns; both set once, read after nsOnce.Do
	ns     *holder
	nsErr  error
}

func (sb *sandbox) live() bool { return sb.desired != "destroyed" && sb.state != "destroyed" }

func (sb *sandbox) stopTimers() {
	for _, t := range sb.timers {
		t.Stop()
	}
	sb.timers = nil
}

// killAll ends every process of the sandbox (memory is lost on stop,
// destroy and server close) and forgets its toolbox sessions.
func (sb *sandbox) killAll() {
	for p := range sb.procs {
		p.kill()
	}
	sb.sessions = map[string]*tsession{}
}

func (s *Server) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/sandbox", s.createSandbox)
	mux.HandleFunc("GET /api/sandbox", s.listSandboxes)
	mux.HandleFunc("GET /api/sandbox/{idOrName}", s.withSandbox(s.getSandbox))
	mux.HandleFunc("DELETE /api/sandbox/{idOrName}", s.withSandbox(s.deleteSandbox))
	mux.HandleFunc("POST /api/sandbox/{idOrName}/start", s.withSandbox(s.startSandbox))
	mux.HandleFunc("POST /api/sandbox/{idOrName}/stop", s.withSandbox(s.stopSandbox))
	mux.HandleFunc("POST /api/sandbox/{idOrName}/pause", s.withSandbox(s.pauseSandbox))
	mux.HandleFunc("GET /api/sandbox/{idOrName}/toolbox-proxy-url", s.withSandbox(func(w http.ResponseWriter, r *http.Request, sb *sandbox) {
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]string{"url": s.ToolboxURL()})
	}))
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		apiError(w, r, http.StatusNotFound, fmt.Sprintf("Cannot %s %s", r.Method, r.URL.Path))
	})
	mux.HandleFunc("/toolbox/{id}/{rest...}", s.toolbox)
}

// withSandbox finds the sandbox like the API's findOneByIdOrName (id first,
// then name; destroyed ones and errored ones being deleted are invisible)
// and calls h with s.mu held; h must unlock.
func (s *Server) withSandbox(h func(http.ResponseWriter, *http.Request, *sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("idOrName")
		s.mu.Lock()
		sb := s.find(key)
		if sb == nil {
			s.mu.Unlock()
			apiError(w, r, http.StatusNotFound, fmt.Sprintf("Sandbox with ID or name %s not found", key))
			return
		}
		h(w, r, sb)
	}
}

func (s *Server) find(key string) *sandbox {
	visible := func(sb *sandbox) bool {
		if sb.state == "destroyed" {
			return false
		}
		return !((sb.state == "error" || sb.state == "build_failed") && sb.desired == "destroyed")
	}
	if sb := s.sandboxes[key]; sb != nil && visible(sb) {
		return sb
	}
	for _, sb := range s.sandboxes {
		if sb.name == key && visible(sb) {
			return sb
		}
	}
	return nil
}

// schedule runs f with s.mu held after one transition delay, unless the
// server closed.
func (s *Server) schedule(sb *sandbox, f func()) {
	t := time.AfterFunc(s.opts.Transition, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return
		}
		sb.updatedAt = time.Now()
		f()
	})
	sb.timers = append(sb.timers, t)
}

type createRequest struct {
	Name                string            `json:"name"`
	Snapshot            string            `json:"snapshot"`
	User                string            `json:"user"`
	Env                 map[string]string `json:"env"`
	Labels              map[string]string `json:"labels"`
	Target              string            `json:"target"`
	AutoStopInterval    *int              `json:"autoStopInterval"`
	AutoArchiveInterval *int              `json:"autoArchiveInterval"`
	AutoDeleteInterval  *int              `json:"autoDeleteInterval"`
	TTLMinutes          *int              `json:"ttlMinutes"`
	BuildInfo           *struct {
		DockerfileContent string `json:"dockerfileContent"`
	} `json:"buildInfo"`
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, r, http.StatusBadRequest, "Invalid request body: "+err.Error())
		return
	}
	if req.Snapshot != "" && s.opts.Snapshots != nil && !slices.Contains(s.opts.Snapshots, req.Snapshot) {
		apiError(w, r, http.StatusBadRequest, fmt.Sprintf("Snapshot %s not found. Did you add it through the Daytona Dashboard?", req.Snapshot))
		return
	}
	image := ""
	if req.BuildInfo != nil {
		image = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(req.BuildInfo.DockerfileContent), "FROM "))
		if image == "" {
			apiError(w, r, http.StatusBadRequest, "buildInfo.dockerfileContent must not be empty")
			return
		}
	}
	if req.TTLMinutes != nil && *req.TTLMinutes < 0 || req.AutoStopInterval != nil && *req.AutoStopInterval < 0 {
		apiError(w, r, http.StatusBadRequest, "intervals must be non-negative")
		return
	}

	s.mu.Lock()
	if req.Name != "" && s.find(req.Name) != nil {
		s.mu.Unlock()
		apiError(w, r, http.StatusConflict, fmt.Sprintf("Sandbox with name %s already exists", req.Name))
		return
	}
	id := newUUID()
	user := req.User
	if user == "" {
		user = "daytona"
	}
	root := filepath.Join(s.dir, id)
	sb := &sandbox{
		id: id, root: root, home: "/home/" + user,
		name: req.Name, user: user, snapshot: req.Snapshot, image: image,
		target: req.Target, class: s.opts.SandboxClass,
		env: req.Env, labels: req.Labels,
		state: "creating", desired: "started", pending: true,
		autoStop: 15, autoArchive: 10080, autoDelete: req.AutoDeleteInterval,
		createdAt: time.Now(), sessions: map[string]*tsession{}, procs: map[*proc]struct{}{},
	}
	sb.updatedAt = sb.createdAt
	if sb.name == "" {
		sb.name = id
	}
	if sb.target == "" {
		sb.target = "us"
	}
	if req.AutoStopInterval != nil {
		sb.autoStop = *req.AutoStopInterval
	}
	if req.AutoArchiveInterval != nil {
		sb.autoArchive = *req.AutoArchiveInterval
	}
	if req.TTLMinutes != nil {
		sb.ttl = *req.TTLMinutes
	}
	if err := makeRoot(root, user); err != nil {
		s.mu.Unlock()
		apiError(w, r, http.StatusInternalServerError, "An unexpected error occurred.")
		return
	}
	fails := slices.Contains(s.opts.FailImages, req.Snapshot) && req.Snapshot != "" ||
		slices.Contains(s.opts.FailImages, image) && image != ""
	finish := func() {
		sb.pending = false
		switch {
		case fails && image != "":
			sb.state, sb.errorReason = "build_failed", "failed to build image "+image
		case fails:
			sb.state, sb.errorReason = "error", "failed to pull snapshot "+req.Snapshot
		default:
			sb.state = "started"
		}
	}
	if image != "" {
		sb.state = "pending_build"
		s.schedule(sb, func() {
			sb.state = "creating"
			s.schedule(sb, finish)
		})
	} else {
		s.schedule(sb, finish)
	}
	if sb.ttl > 0 {
		sb.timers = append(sb.timers, time.AfterFunc(time.Duration(sb.ttl)*time.Minute, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.closed && sb.live() {
				s.destroy(sb)
			}
		}))
	}
	s.sandboxes[id] = sb
	dto := s.dto(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, dto)
}

// makeRoot lays out a sandbox's host directory: home/<user> and a
// world-writable sticky tmp, the directories mounted at /home and /tmp.
func makeRoot(root, user string) error {
	if err := os.MkdirAll(filepath.Join(root, "home", user), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(root, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	return os.Chmod(tmp, 0o777|os.ModeSticky)
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	dto := s.dto(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, dto)
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	if sb.pending && sb.state != "pending_build" {
		s.mu.Unlock()
		apiError(w, r, http.StatusConflict, "Sandbox state change in progress")
		return
	}
	s.destroy(sb)
	dto := s.dto(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, dto)
}

// destroy is the soft delete: the name is freed at once, the sandbox stops
// counting as live, and it disappears after destroying->destroyed.
func (s *Server) destroy(sb *sandbox) {
	sb.stopTimers()
	sb.desired, sb.pending = "destroyed", true
	sb.name = fmt.Sprintf("DESTROYED_%s_%d", sb.name, time.Now().UnixNano())
	s.schedule(sb, func() {
		sb.state = "destroying"
		sb.killAll()
		s.schedule(sb, func() {
			sb.state, sb.pending = "destroyed", false
			delete(s.sandboxes, sb.id)
			s.reap(sb)
		})
	})
}

// reap removes a destroyed sandbox's namespace and files, off the lock:
// stopping the holder waits for it to exit.
func (s *Server) reap(sb *sandbox) {
	s.procs.Add(1)
	go func() {
		defer s.procs.Done()
		sb.nsOnce.Do(func() { sb.nsErr = errors.New("sandbox is gone") })
		if sb.ns != nil {
			sb.ns.stop()
		}
		os.RemoveAll(sb.root)
	}()
}

func (s *Server) stopSandbox(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	status, msg := 0, ""
	switch {
	case sb.state == "error" || sb.state == "build_failed":
		status, msg = http.StatusBadRequest, "Sandbox is in an errored state"
	case sb.state != sb.desired:
		status, msg = http.StatusConflict, "Sandbox state change in progress"
	case sb.state != "started" && sb.state != "paused":
		status, msg = http.StatusBadRequest, "Sandbox is not in a stoppable state"
	case sb.pending:
		status, msg = http.StatusConflict, "Sandbox state change in progress"
	}
	if status != 0 {
		s.mu.Unlock()
		apiError(w, r, status, msg)
		return
	}
	if sb.autoDelete != nil && *sb.autoDelete == 0 {
		s.destroy(sb) // an ephemeral sandbox is deleted when it stops
	} else {
		sb.desired, sb.pending = "stopped", true
		s.schedule(sb, func() {
			sb.state = "stopping"
			sb.killAll()
			s.schedule(sb, func() { sb.state, sb.pending = "stopped", false })
		})
	}
	dto := s.dto(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, dto)
}

func (s *Server) startSandbox(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	if sb.state == "started" && sb.desired == "started" {
		dto := s.dto(sb)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, dto)
		return
	}
	wasPaused := sb.state == "paused"
	status, msg := 0, ""
	switch {
	case sb.state == "error" || sb.state == "build_failed":
		status, msg = http.StatusBadRequest, "Sandbox is in an errored state"
	case sb.state != sb.desired && !(sb.desired == "archived" && (sb.state == "stopped" || sb.state == "archiving")):
		status, msg = http.StatusConflict, "Sandbox state change in progress"
	case !slices.Contains([]string{"stopped", "archived", "archiving", "paused"}, sb.state):
		status, msg = http.StatusBadRequest, "Sandbox is not in valid state"
	case sb.pending:
		status, msg = http.StatusConflict, "Sandbox state change in progress"
	case wasPaused && sb.class != "linux-vm" && sb.class != "windows":
		status, msg = http.StatusUnprocessableEntity, "Resuming is not supported for this sandbox"
	}
	if status != 0 {
		s.mu.Unlock()
		apiError(w, r, status, msg)
		return
	}
	sb.desired, sb.pending = "started", true
	s.schedule(sb, func() {
		if wasPaused {
			sb.state = "resuming"
		} else {
			sb.state = "starting"
		}
		s.schedule(sb, func() { sb.state, sb.pending = "started", false })
	})
	dto := s.dto(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, dto)
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	status, msg := 0, ""
	switch {
	case sb.state != "started":
		status, msg = http.StatusBadRequest, "Sandbox must be in started state to pause"
	case sb.pending:
		status, msg = http.StatusConflict, "Sandbox state change in progress"
	case sb.class != "linux-vm" && sb.class != "windows":
		status, msg = http.StatusUnprocessableEntity, "Pausing is not supported for this sandbox"
	}
	if status != 0 {
		s.mu.Unlock()
		apiError(w, r, status, msg)
		return
	}
	sb.state, sb.desired, sb.pending = "pausing", "paused", true
	s.schedule(sb, func() { sb.state, sb.pending = "paused", false })
	dto := s.dto(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, dto)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 200 {
			apiError(w, r, http.StatusBadRequest, "limit must not be greater than 200, limit must not be less than 1")
			return
		}
		limit = n
	}
	if s.opts.PageSize > 0 {
		limit = min(limit, s.opts.PageSize)
	}
	offset := 0
	if v := q.Get("cursor"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			apiError(w, r, http.StatusBadRequest, "Invalid cursor")
			return
		}
		offset = n
	}
	var want map[string]string
	if v := q.Get("labels"); v != "" {
		if err := json.Unmarshal([]byte(v), &want); err != nil {
			apiError(w, r, http.StatusBadRequest, "Invalid labels JSON format")
			return
		}
	}
	states := q["states"]

	s.mu.Lock()
	var all []*sandbox
	for _, sb := range s.sandboxes {
		if !sb.live() {
			continue
		}
		if len(states) > 0 && !slices.Contains(states, sb.state) {
			continue
		}
		ok := true
		for k, v := range want {
			if sb.labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			all = append(all, sb)
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if !all[i].createdAt.Equal(all[j].createdAt) {
			return all[i].createdAt.After(all[j].createdAt)
		}
		return all[i].id < all[j].id
	})
	items := []sandboxDTO{}
	for i := offset; i < len(all) && i < offset+limit; i++ {
		d := s.dto(all[i])
		d.Env = nil // list items carry no env
		items = append(items, d)
	}
	var next *string
	if offset+limit < len(all) {
		c := strconv.Itoa(offset + limit)
		next = &c
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"items": items, "nextCursor": next})
}

type sandboxDTO struct {
	ID                  string            `json:"id"`
	OrganizationID      string            `json:"organizationId"`
	Name                string            `json:"name"`
	Snapshot            string            `json:"snapshot,omitempty"`
	User                string            `json:"user"`
	Env                 map[string]string `json:"env,omitempty"`
	Labels              map[string]string `json:"labels"`
	Public              bool              `json:"public"`
	NetworkBlockAll     bool              `json:"networkBlockAll"`
	Target              string            `json:"target"`
	CPU                 float64           `json:"cpu"`
	GPU                 float64           `json:"gpu"`
	Memory              float64           `json:"memory"`
	Disk                float64           `json:"disk"`
	State               string            `json:"state"`
	DesiredState        string            `json:"desiredState"`
	ErrorReason         string            `json:"errorReason,omitempty"`
	Recoverable         bool              `json:"recoverable"`
	BackupState         string            `json:"backupState"`
	AutoStopInterval    int               `json:"autoStopInterval"`
	AutoArchiveInterval int               `json:"autoArchiveInterval"`
	AutoDeleteInterval  int               `json:"autoDeleteInterval"`
	BuildInfo           any               `json:"buildInfo,omitempty"`
	CreatedAt           string            `json:"createdAt"`
	UpdatedAt           string            `json:"updatedAt"`
	SandboxClass        string            `json:"sandboxClass"`
	DaemonVersion       string            `json:"daemonVersion"`
	RunnerID            string            `json:"runnerId"`
	ToolboxProxyURL     string            `json:"toolboxProxyUrl"`
}

func (s *Server) dto(sb *sandbox) sandboxDTO {
	d := sandboxDTO{
		ID: sb.id, OrganizationID: s.opts.OrganizationID, Name: sb.name, Snapshot: sb.snapshot,
		User: sb.user, Env: cloneMap(sb.env), Labels: cloneMap(sb.labels), Target: sb.target,
		CPU: 1, Memory: 1, Disk: 3, State: sb.state, DesiredState: sb.desired, ErrorReason: sb.errorReason,
		BackupState: "None", AutoStopInterval: sb.autoStop, AutoArchiveInterval: sb.autoArchive,
		AutoDeleteInterval: -1, CreatedAt: sb.createdAt.UTC().Format(time.RFC3339Nano),
		UpdatedAt: sb.updatedAt.UTC().Format(time.RFC3339Nano), SandboxClass: sb.class,
		DaemonVersion: "v0.0.0-fake", RunnerID: "fake-runner", ToolboxProxyURL: s.ToolboxURL(),
	}
	if d.OrganizationID == "" {
		d.OrganizationID = "fake-organization"
	}
	if d.Labels == nil {
		d.Labels = map[string]string{}
	}
	if sb.autoDelete != nil {
		d.AutoDeleteInterval = *sb.autoDelete
	}
	if sb.image != "" {
		d.BuildInfo = map[string]string{"dockerfileContent": "FROM " + sb.image}
	}
	return d
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

type sandboxKey struct{}

// toolbox plays the proxy and runner in front of the daemon: an unknown
// sandbox fails the proxy's bearer check (401), a destroyed container is a
// runner 404, and any sandbox not started has no IP (runner 400).
func (s *Server) toolbox(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	sb := s.sandboxes[id]
	switch {
	case sb == nil || sb.state == "destroyed":
		s.mu.Unlock()
		daemonError(w, r, http.StatusUnauthorized, "UNAUTHORIZED", "authentication failed: Bearer token is invalid")
		return
	case sb.desired == "destroyed" || sb.state == "destroying" || sb.state == "archived":
		s.mu.Unlock()
		daemonError(w, r, http.StatusNotFound, "NOT_FOUND", "sandbox container not found: Error response from daemon: No such container: "+id)
		return
	case sb.state != "started":
		s.mu.Unlock()
		daemonError(w, r, http.StatusBadRequest, "BAD_REQUEST", "no IP address found. Is the Sandbox started?")
		return
	}
	s.mu.Unlock()
	r2 := r.Clone(context.WithValue(r.Context(), sandboxKey{}, sb))
	r2.URL.Path = "/" + r.PathValue("rest")
	r2.URL.RawPath = ""
	s.daemon(w, r2, sb)
}
