package daytona

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/esf-dev/esf/workspace"
)

// Labels under labelPrefix are the adapter's own bookkeeping on the
// sandbox; they never appear in Metadata.
const (
	labelPrefix  = "esf.dev/"
	labelWorkDir = labelPrefix + "workdir"
)

func isInternalLabel(k string) bool { return strings.HasPrefix(k, labelPrefix) }

// Provider creates and attaches Daytona sandboxes as workspace sessions.
// It is safe for concurrent use.
type Provider struct {
	cfg Config
	c   *client
}

var (
	_ workspace.Provider   = (*Provider)(nil)
	_ workspace.Enumerator = (*Provider)(nil)
)

// New checks cfg and returns a Provider.
func New(cfg Config) (*Provider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	cfg.APIURL = strings.TrimRight(cfg.APIURL, "/")
	cfg.Labels = maps.Clone(cfg.Labels)
	p := &Provider{cfg: cfg}
	p.c = &client{hc: cfg.HTTPClient, cfg: &p.cfg}
	return p, nil
}

// sandboxInfo is the part of Daytona's Sandbox (and SandboxListItem) the
// adapter reads.
type sandboxInfo struct {
	ID              string            `json:"id"`
	Name            string            `json:"name"`
	State           string            `json:"state"`
	DesiredState    string            `json:"desiredState"`
	ErrorReason     string            `json:"errorReason"`
	Labels          map[string]string `json:"labels"`
	ToolboxProxyURL string            `json:"toolboxProxyUrl"`
}

// gone: being destroyed or destroyed; for the contract the session no
// longer exists.
func (sb *sandboxInfo) gone() bool {
	return sb.DesiredState == "destroyed" || sb.State == "destroying" || sb.State == "destroyed"
}

func (sb *sandboxInfo) failed() bool { return sb.State == "error" || sb.State == "build_failed" }

func (sb *sandboxInfo) running() bool {
	return sb.State == "started" && (sb.DesiredState == "started" || sb.DesiredState == "")
}

// suspended: stopped, archived or paused, or on its way there. Any of these
// is "paused" for the contract.
func (sb *sandboxInfo) suspended() bool {
	switch sb.DesiredState {
	case "stopped", "archived", "paused":
		return true
	}
	switch sb.State {
	case "stopped", "stopping", "archived", "archiving", "paused", "pausing":
		return sb.DesiredState != "started"
	}
	return false
}

// stable: no state change in flight.
func (sb *sandboxInfo) stable() bool { return sb.State == sb.DesiredState || sb.failed() }

func (sb *sandboxInfo) failure(op string) error {
	return &workspace.ProviderError{Provider: providerName, Op: op, Code: sb.State,
		Message: fmt.Sprintf("sandbox %s is in state %s: %s", sb.ID, sb.State, sb.ErrorReason)}
}

func (p *Provider) sandboxURL(idOrName string, sub ...string) string {
	u := p.cfg.APIURL + "/sandbox/" + url.PathEscape(idOrName)
	for _, s := range sub {
		u += "/" + s
	}
	return u
}

func (p *Provider) get(ctx context.Context, op, id string) (*sandboxInfo, error) {
	var sb sandboxInfo
	if err := p.c.doJSON(ctx, op, request{method: http.MethodGet, url: p.sandboxURL(id)}, &sb); err != nil {
		return nil, apiError(op, err, true)
	}
	return &sb, nil
}

// waitSandbox polls the sandbox with backoff until done says so.
func (p *Provider) waitSandbox(ctx context.Context, op, id string, done func(*sandboxInfo) (bool, error)) (*sandboxInfo, error) {
	delay := p.cfg.PollInterval
	for {
		sb, err := p.get(ctx, op, id)
		if err != nil {
			return nil, err
		}
		if ok, err := done(sb); ok || err != nil {
			return sb, err
		}
		if err := sleep(ctx, delay); err != nil {
			return nil, workspace.ContextError(ctx, "daytona "+op, err)
		}
		delay = min(delay*2, p.cfg.PollMax)
	}
}

// untilStarted is the predicate of a sandbox expected to reach "started".
func untilStarted(op string) func(*sandboxInfo) (bool, error) {
	return func(sb *sandboxInfo) (bool, error) {
		switch {
		case sb.gone():
			return false, fmt.Errorf("daytona %s: sandbox %s was destroyed: %w", op, sb.ID, workspace.ErrNotFound)
		case sb.failed():
			return false, sb.failure(op)
		}
		return sb.running(), nil
	}
}

type createBody struct {
	Name             string            `json:"name"`
	Snapshot         string            `json:"snapshot,omitempty"`
	BuildInfo        *buildInfo        `json:"buildInfo,omitempty"`
	Env              map[string]string `json:"env,omitempty"`
	Labels           map[string]string `json:"labels,omitempty"`
	Target           string            `json:"target,omitempty"`
	AutoStopInterval *int              `json:"autoStopInterval,omitempty"`
	TTLMinutes       int               `json:"ttlMinutes,omitempty"`
}

type buildInfo struct {
	DockerfileContent string `json:"dockerfileContent"`
}

// Create starts a sandbox and waits until it is started. The sandbox gets a
// generated name, so that when ctx ends before Daytona's answer arrives the
// sandbox the server may still have made can be found and deleted.
func (p *Provider) Create(ctx context.Context, spec workspace.Spec) (workspace.Session, error) {
	labels := map[string]string{}
	for k, v := range spec.Metadata {
		if isInternalLabel(k) {
			return nil, fmt.Errorf("daytona create: metadata key %q uses the reserved prefix %q: %w", k, labelPrefix, workspace.ErrUnsupported)
		}
		labels[k] = v
	}
	maps.Copy(labels, p.cfg.Labels)
	if spec.WorkDir != "" {
		labels[labelWorkDir] = spec.WorkDir
	}
	body := createBody{Name: "esf-" + randHex(10), Env: spec.Env, Labels: labels, Target: p.cfg.Target}
	switch {
	case spec.Image == "":
	case p.cfg.ImageKind == ImageOCI:
		body.BuildInfo = &buildInfo{DockerfileContent: "FROM " + spec.Image}
	default:
		body.Snapshot = spec.Image
	}
	switch {
	case p.cfg.AutoStopMinutes > 0:
		body.AutoStopInterval = &p.cfg.AutoStopMinutes
	case p.cfg.AutoStopMinutes < 0:
		body.AutoStopInterval = new(int)
	}
	if spec.Timeout > 0 {
		body.TTLMinutes = int((spec.Timeout + time.Minute - 1) / time.Minute)
	}

	var wrote atomic.Bool
	var sb sandboxInfo
	err := p.c.doJSON(ctx, "create", request{method: http.MethodPost, url: p.cfg.APIURL + "/sandbox", json: body, wrote: &wrote}, &sb)
	if err != nil {
		answered := statusOf(err) != 0
		err = apiError("create", err, false)
		if !answered && wrote.Load() {
			// No answer, but the request went out: the sandbox may exist.
			return nil, errors.Join(err, p.cleanup(ctx, body.Name, true))
		}
		return nil, err
	}
	s, err := p.start(ctx, &sb, spec.WorkDir)
	if err != nil {
		return nil, errors.Join(err, p.cleanup(ctx, sb.ID, false))
	}
	return s, nil
}

// start waits for a created sandbox and readies its session: home
// directory known, working directory present.
func (p *Provider) start(ctx context.Context, sb *sandboxInfo, workDir string) (*Session, error) {
	if !sb.running() {
		var err error
		if sb, err = p.waitSandbox(ctx, "create", sb.ID, untilStarted("create")); err != nil {
			return nil, err
		}
	}
	s, err := p.session(ctx, sb)
	if err != nil {
		return nil, err
	}
	_, cwd, err := s.ready(ctx, "create")
	if err != nil {
		return nil, err
	}
	if workDir != "" {
		q := url.Values{"path": {cwd}, "mode": {"0755"}}
		resp, err := s.tb(ctx, "create", request{method: http.MethodPost, url: "/files/folder", query: q})
		if err != nil {
			return nil, toolboxError("create", err)
		}
		resp.Body.Close()
	}
	return s, nil
}

// cleanup deletes what a failed Create left, on a fresh context: ctx may
// be why Create failed. byName is set when Daytona never told us the id;
// the sandbox may then not be visible yet, so a few misses are retried.
func (p *Provider) cleanup(ctx context.Context, key string, byName bool) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.CleanupTimeout)
	defer cancel()
	misses := 0
	delay := p.cfg.PollInterval
	for {
		err := p.destroy(cctx, "cleanup", key)
		switch st := statusOf(err); {
		case err == nil:
			return nil
		case st == http.StatusNotFound && byName && misses < 4:
			misses++
		case st == http.StatusNotFound || errors.Is(err, workspace.ErrNotFound):
			return nil
		case st == http.StatusConflict, st == http.StatusTooManyRequests, st >= 500, st == 0 && cctx.Err() == nil:
			// a state change in flight, or a transient failure: try again
		default:
			return fmt.Errorf("daytona: could not delete sandbox %s after a failed create: %w", key, err)
		}
		if err := sleep(cctx, delay); err != nil {
			return fmt.Errorf("daytona: gave up deleting sandbox %s after a failed create: %w", key, err)
		}
		delay = min(delay*2, p.cfg.PollMax)
	}
}

// destroy is one DELETE. It returns the raw *httpError for the caller to
// judge 404 and 409.
func (p *Provider) destroy(ctx context.Context, op, key string) error {
	return p.c.doJSON(ctx, op, request{method: http.MethodDelete, url: p.sandboxURL(key)}, nil)
}

// Attach returns a handle to an existing sandbox without changing its
// state. A sandbox that is starting is waited for; a stopped, archived or
// paused one gives a handle that answers ErrPaused until Resume.
func (p *Provider) Attach(ctx context.Context, id string) (workspace.Session, error) {
	if id == "" || strings.ContainsAny(id, "/?#") {
		return nil, fmt.Errorf("daytona attach %q: %w", id, workspace.ErrNotFound)
	}
	sb, err := p.waitSandbox(ctx, "attach", id, func(sb *sandboxInfo) (bool, error) {
		switch {
		case sb.gone():
			return false, fmt.Errorf("daytona attach %s: sandbox is being destroyed: %w", id, workspace.ErrNotFound)
		case sb.failed():
			return false, sb.failure("attach")
		}
		return sb.running() || sb.suspended(), nil
	})
	if err != nil {
		return nil, err
	}
	s, err := p.session(ctx, sb)
	if err != nil {
		return nil, err
	}
	s.paused = sb.suspended()
	return s, nil
}

// session builds the handle; the toolbox lives at {toolboxProxyUrl}/{id}.
func (p *Provider) session(ctx context.Context, sb *sandboxInfo) (*Session, error) {
	base := sb.ToolboxProxyURL
	if base == "" {
		var out struct {
			URL string `json:"url"`
		}
		if err := p.c.doJSON(ctx, "toolbox-url", request{method: http.MethodGet, url: p.sandboxURL(sb.ID, "toolbox-proxy-url")}, &out); err != nil {
			return nil, apiError("toolbox-url", err, true)
		}
		base = out.URL
	}
	return &Session{
		p:       p,
		id:      sb.ID,
		toolbox: strings.TrimRight(base, "/") + "/" + url.PathEscape(sb.ID),
		workDir: sb.Labels[labelWorkDir],
	}, nil
}

// Sessions lists the sandboxes carrying Config.Labels, following Daytona's
// cursor pagination. Daytona documents the list as eventually consistent.
func (p *Provider) Sessions(ctx context.Context) ([]workspace.Info, error) {
	q := url.Values{"limit": {"200"}}
	if len(p.cfg.Labels) > 0 {
		b, _ := json.Marshal(p.cfg.Labels)
		q.Set("labels", string(b))
	}
	var out []workspace.Info
	for {
		var page struct {
			Items      []sandboxInfo `json:"items"`
			NextCursor *string       `json:"nextCursor"`
		}
		if err := p.c.doJSON(ctx, "list", request{method: http.MethodGet, url: p.cfg.APIURL + "/sandbox", query: q}, &page); err != nil {
			return nil, apiError("list", err, false)
		}
		for _, sb := range page.Items {
			if sb.gone() {
				continue
			}
			out = append(out, workspace.Info{ID: sb.ID, Paused: sb.suspended(), Metadata: p.metadata(sb.Labels)})
		}
		if page.NextCursor == nil || *page.NextCursor == "" || len(page.Items) == 0 {
			return out, nil
		}
		q.Set("cursor", *page.NextCursor)
	}
}

func (p *Provider) metadata(labels map[string]string) map[string]string {
	md := map[string]string{}
	for k, v := range labels {
		if _, cfg := p.cfg.Labels[k]; cfg || isInternalLabel(k) {
			continue
		}
		md[k] = v
	}
	return md
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
