package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// Metadata keys the adapter keeps on every sandbox it creates. They are
// hidden from workspace.Info.
const (
	// MetaWorkDir records Spec.WorkDir (resolved), so Attach knows it.
	MetaWorkDir = "esf.workdir"
	// MetaCreate is a random token per Create call: when the answer to a
	// create is lost (cancelled context), the sandbox is found by it and
	// killed.
	MetaCreate = "esf.create"
)

// Provider creates and attaches E2B sandboxes (and, configured as a
// profile, CubeSandbox ones). It is safe for concurrent use.
type Provider struct {
	cfg Config
	api *api
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
	cfg = cfg.withDefaults()
	return &Provider{cfg: cfg, api: &api{cfg: cfg}}, nil
}

func randomToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Create starts a sandbox from Spec.Image (a template id or alias).
// Spec.Env becomes the sandbox's environment, Spec.Timeout its lifetime,
// Spec.Metadata its metadata; Spec.WorkDir is created.
func (p *Provider) Create(ctx context.Context, spec workspace.Spec) (workspace.Session, error) {
	if spec.Timeout < 0 {
		return nil, fmt.Errorf("%s create: negative timeout: %w", p.cfg.Name, workspace.ErrPolicy)
	}
	workdir := p.cfg.Home
	if spec.WorkDir != "" {
		var err error
		if workdir, err = vfs.Resolve(p.cfg.Home, p.cfg.Home, spec.WorkDir); err != nil {
			return nil, err
		}
	}
	timeout := spec.Timeout
	if timeout == 0 {
		timeout = p.cfg.Timeout
	}
	template := spec.Image
	if template == "" {
		template = p.cfg.Template
	}
	token := randomToken()
	meta := make(map[string]string, len(spec.Metadata)+2)
	for k, v := range spec.Metadata {
		meta[k] = v
	}
	meta[MetaWorkDir] = workdir
	meta[MetaCreate] = token

	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s create: %w", p.cfg.Name, err)
	}
	// The request outlives ctx (by CleanupTimeout at most): a create the
	// service already started then still answers with the id to kill.
	// Cutting it would leave a sandbox only a later listing could find,
	// and the service may list it only once it has finished creating.
	reqCtx, release := outlive(ctx, p.cfg.CleanupTimeout)
	sb, err := p.api.create(reqCtx, &newSandbox{
		TemplateID: template,
		Timeout:    seconds(timeout),
		Secure:     true,
		Metadata:   meta,
		EnvVars:    spec.Env,
	})
	release()
	if ctx.Err() != nil {
		if err == nil {
			p.cleanupID(sb.SandboxID)
		} else {
			p.cleanupToken(token)
		}
		return nil, fmt.Errorf("%s create: %w", p.cfg.Name, ctx.Err())
	}
	if err != nil {
		var pe *workspace.ProviderError
		if !errors.As(err, &pe) || pe.Status == 0 {
			// No answer: the request may have reached the service.
			p.cleanupToken(token)
		} else if pe.Status == http.StatusNotFound {
			// A 404 on create names a missing template, not a session.
			pe.Class = nil
		}
		return nil, err
	}
	s := p.newSession(sb, workdir, timeout)
	if err := p.prepare(ctx, s); err != nil {
		p.cleanupID(sb.SandboxID)
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		p.cleanupID(sb.SandboxID)
		return nil, fmt.Errorf("%s create: %w", p.cfg.Name, err)
	}
	return s, nil
}

// prepare creates the working directory when it is not home.
func (p *Provider) prepare(ctx context.Context, s *Session) error {
	if s.cwd == s.home {
		return nil
	}
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	if _, err := c.MakeDir(ctx, s.cwd); err != nil && !isCode(err, codeAlreadyExists) {
		return s.mapErr(ctx, "create", s.cwd, err)
	}
	return nil
}

// outlive returns a context for a request that must not be cut the moment
// ctx ends: it ends grace after ctx does, or at release, which waits for
// the watcher so no goroutine outlives the call.
func outlive(ctx context.Context, grace time.Duration) (context.Context, func()) {
	reqCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	finished := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-finished:
			return
		case <-ctx.Done():
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-finished:
		case <-t.C:
			cancel()
		}
	}()
	return reqCtx, func() {
		close(finished)
		wg.Wait()
		cancel()
	}
}

func (p *Provider) background() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), p.cfg.CleanupTimeout)
}

func (p *Provider) cleanupID(id string) {
	ctx, cancel := p.background()
	defer cancel()
	_ = p.api.kill(ctx, id)
}

// cleanupToken kills the sandboxes a lost create left. The service may
// still be creating when the first listing runs, so it looks a few times
// before concluding nothing was made.
func (p *Provider) cleanupToken(token string) {
	ctx, cancel := p.background()
	defer cancel()
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 && sleep(ctx, p.cfg.PollInterval) != nil {
			return
		}
		list, err := p.api.list(ctx, map[string]string{MetaCreate: token})
		if err != nil {
			continue
		}
		found := false
		for _, sb := range list {
			if sb.Metadata[MetaCreate] == token {
				found = true
				_ = p.api.kill(ctx, sb.SandboxID)
			}
		}
		if found {
			return
		}
	}
}

// Attach returns a handle to a running or paused sandbox without changing
// its state (a GET, not a connect, which would resume a paused one).
func (p *Provider) Attach(ctx context.Context, id string) (workspace.Session, error) {
	if id == "" {
		return nil, fmt.Errorf("%s attach %q: %w", p.cfg.Name, id, workspace.ErrNotFound)
	}
	sb, err := p.lookup(ctx, id)
	if err != nil {
		var pe *workspace.ProviderError
		if errors.As(err, &pe) && pe.Status == http.StatusBadRequest {
			pe.Class = workspace.ErrNotFound // "Invalid sandbox ID"
		}
		return nil, err
	}
	workdir := p.cfg.Home
	if w := sb.Metadata[MetaWorkDir]; len(w) > 0 && w[0] == '/' {
		workdir = w
	}
	return p.newSession(sb, workdir, p.cfg.Timeout), nil
}

// lookup reads a sandbox's state without changing it and, when it is
// running, connects for the credentials its envd wants: the detail answer
// has the access token but not the traffic token. Connect leaves a running
// sandbox running; it only extends its lifetime to at least Config.Timeout
// from now. A sandbox that is pausing (connect answers 409) counts as
// paused.
func (p *Provider) lookup(ctx context.Context, id string) (*sandboxInfo, error) {
	sb, err := p.api.get(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.SandboxID == "" {
		sb.SandboxID = id
	}
	if sb.State != "running" {
		return sb, nil
	}
	c, st, err := p.api.connect(ctx, id, p.cfg.Timeout)
	switch {
	case err == nil:
		if c.SandboxID == "" {
			c.SandboxID = id
		}
		if c.EnvdAccessToken == nil {
			c.EnvdAccessToken = sb.EnvdAccessToken
		}
		c.State, c.Metadata = "running", sb.Metadata
		return c, nil
	case st == http.StatusConflict:
		sb.State = "pausing"
		return sb, nil
	}
	return nil, err
}

// Sessions lists the running and paused sandboxes the API key can see.
func (p *Provider) Sessions(ctx context.Context) ([]workspace.Info, error) {
	list, err := p.api.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := make([]workspace.Info, 0, len(list))
	for _, sb := range list {
		info := workspace.Info{ID: sb.SandboxID, Paused: sb.State == "paused"}
		for k, v := range sb.Metadata {
			if k == MetaWorkDir || k == MetaCreate {
				continue
			}
			if info.Metadata == nil {
				info.Metadata = map[string]string{}
			}
			info.Metadata[k] = v
		}
		out = append(out, info)
	}
	return out, nil
}

// target says how to reach sb's envd under this configuration.
func (p *Provider) target(sb *sandboxInfo) envd.Target {
	c := p.cfg
	domain := c.Domain
	if sb.Domain != nil && *sb.Domain != "" {
		domain = *sb.Domain
	}
	h := http.Header{}
	h.Set("User-Agent", c.UserAgent)
	h.Set(envd.HeaderSandboxID, sb.SandboxID)
	h.Set(envd.HeaderSandboxPort, strconv.Itoa(c.EnvdPort))
	if sb.EnvdAccessToken != nil && *sb.EnvdAccessToken != "" {
		h.Set(envd.HeaderAccessToken, *sb.EnvdAccessToken)
	}
	if sb.TrafficAccessToken != nil && *sb.TrafficAccessToken != "" {
		for _, name := range c.TrafficTokenHeaders {
			h.Set(name, *sb.TrafficAccessToken)
		}
	}
	t := envd.Target{Header: h, User: c.User}
	if c.SandboxURL != "" {
		t.BaseURL = c.SandboxURL
		return t
	}
	host := fmt.Sprintf("%d-%s.%s", c.EnvdPort, sb.SandboxID, domain)
	if c.ProxyPort != 0 {
		host += ":" + strconv.Itoa(c.ProxyPort)
	}
	if c.ProxyAddr != "" {
		t.BaseURL, t.Host = c.EnvdScheme+"://"+c.ProxyAddr, host
	} else {
		t.BaseURL = c.EnvdScheme + "://" + host
	}
	return t
}

func (p *Provider) newSession(sb *sandboxInfo, workdir string, timeout time.Duration) *Session {
	s := &Session{p: p, id: sb.SandboxID, home: p.cfg.Home, cwd: workdir, timeout: timeout}
	s.setSandbox(sb)
	return s
}
