package opensandbox

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/workspace"
)

// reservedPrefix marks the metadata keys the adapter keeps for itself; they
// are label-safe (a DNS prefix and a short name) and hidden from Info.
const (
	reservedPrefix = "workspace.esf.dev/"
	nonceKey       = reservedPrefix + "create"
	workdirKey     = reservedPrefix + "workdir"
)

// Provider is a workspace.Provider and workspace.Enumerator over one
// OpenSandbox server. It is safe for concurrent use.
type Provider struct {
	cfg Config
	api *url.URL // BaseURL + /v1

	mu      sync.Mutex
	remotes map[string]*remote // sandboxes this Provider has handles on
}

var (
	_ workspace.Provider   = (*Provider)(nil)
	_ workspace.Enumerator = (*Provider)(nil)
)

// New checks cfg and returns a Provider. It makes no network call.
func New(cfg Config) (*Provider, error) {
	c, u, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Provider{cfg: c, api: u, remotes: map[string]*remote{}}, nil
}

// remote is what every handle on one sandbox shares within a Provider: the
// pause state (so a Pause through one handle is ErrPaused on all of them at
// once, without asking the server) and the resolved execd endpoint.
type remote struct {
	id string

	mu     sync.Mutex
	paused bool
	gone   bool // a handle of this Provider deleted it
	ep     *execdEndpoint
	home   string
}

func (p *Provider) remoteFor(id string) *remote {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.remotes[id]
	if r == nil {
		r = &remote{id: id}
		p.remotes[id] = r
	}
	return r
}

func (p *Provider) forget(id string) {
	p.mu.Lock()
	delete(p.remotes, id)
	p.mu.Unlock()
}

func (r *remote) setPaused(v bool) {
	r.mu.Lock()
	r.paused = v
	r.mu.Unlock()
}

func (r *remote) state() (paused, gone bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.paused, r.gone
}

// Create provisions a sandbox from spec.Image (or Config.Image), waits for it
// to run and for execd to answer, and creates the working directory. When
// anything fails, or ctx ends, the sandbox is deleted on a fresh context
// (see createOrClean: a Create cancelled while the server is still creating
// returns once the server has answered, at most CleanupTimeout later).
func (p *Provider) Create(ctx context.Context, spec workspace.Spec) (workspace.Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, ctxError(ctx, "create")
	}
	image := spec.Image
	if image == "" {
		image = p.cfg.Image
	}
	if image == "" {
		return nil, fmt.Errorf("opensandbox create: no image (Spec.Image and Config.Image are empty): %w", workspace.ErrUnsupported)
	}
	nonce, err := randomHex(16)
	if err != nil {
		return nil, err
	}
	md := map[string]string{}
	for k, v := range spec.Metadata {
		md[k] = v
	}
	for k, v := range p.cfg.Metadata {
		md[k] = v
	}
	for k := range md {
		if strings.HasPrefix(k, reservedPrefix) {
			return nil, fmt.Errorf("opensandbox create: metadata key %q uses the adapter's reserved prefix: %w", k, workspace.ErrPolicy)
		}
	}
	md[nonceKey] = nonce
	for k, v := range encodeWorkdir(spec.WorkDir) {
		md[k] = v
	}
	req := createRequest{
		Image:          imageSpec{URI: image},
		Entrypoint:     p.cfg.Entrypoint,
		ResourceLimits: p.cfg.ResourceLimits,
		Env:            spec.Env,
		Metadata:       md,
	}
	ttl := spec.Timeout
	if ttl == 0 {
		ttl = p.cfg.DefaultTimeout
	}
	if ttl > 0 {
		secs := int64((max(ttl, MinTimeout) + time.Second - 1) / time.Second)
		req.Timeout = &secs
	}

	sb, err := p.createOrClean(ctx, req, nonce)
	if err != nil {
		return nil, err
	}
	s, err := p.ready(ctx, sb.ID, spec.WorkDir)
	if err != nil {
		p.cleanup(ctx, sb.ID)
		return nil, err
	}
	return s, nil
}

// createOrClean posts the create. The request does not follow ctx: a
// server that has begun creating finishes (the Docker runtime pulls and
// starts before it answers) whether or not the client still listens, so a
// caller that gives up mid-request would leave a sandbox nobody knows of.
// Instead, once ctx ends, the answer is still awaited (up to
// CleanupTimeout) and whatever it names is deleted; only if it never comes
// is the sandbox looked for by its nonce. Either way the error matches ctx.
func (p *Provider) createOrClean(ctx context.Context, req createRequest, nonce string) (apiSandbox, error) {
	type result struct {
		sb  apiSandbox
		err error
	}
	pctx, cancel := context.WithCancel(detach(ctx))
	defer cancel()
	done := make(chan result, 1)
	go func() {
		sb, err := p.createSandbox(pctx, req)
		done <- result{sb, err}
	}()
	var r result
	select {
	case r = <-done:
		if r.err == nil {
			return r.sb, nil
		}
		// A transport failure or a 5xx leaves it unknown whether the server
		// acted; a sandbox it made would carry the nonce.
		var pe *workspace.ProviderError
		if !errors.As(r.err, &pe) || pe.Status >= 500 || pe.Status == 0 {
			p.cleanupNonce(ctx, nonce)
		}
		return apiSandbox{}, r.err
	case <-ctx.Done():
	}
	t := time.NewTimer(p.cfg.CleanupTimeout)
	defer t.Stop()
	select {
	case r = <-done:
	case <-t.C:
		cancel()
		r = <-done
		r.err = errors.New("no answer")
	}
	switch {
	case r.err == nil:
		p.cleanup(ctx, r.sb.ID)
	case !isStatus(r.err, http.StatusBadRequest) && !isStatus(r.err, http.StatusUnauthorized):
		p.cleanupNonce(ctx, nonce)
	}
	return apiSandbox{}, ctxError(ctx, "create")
}

// ready waits for a created sandbox to run and execd to answer, then makes
// the working directory.
func (p *Provider) ready(ctx context.Context, id, workdir string) (*session, error) {
	rctx, cancel := context.WithTimeout(ctx, p.cfg.ReadyTimeout)
	defer cancel()
	if _, err := p.waitState(rctx, id, "create", stateRunning); err != nil {
		return nil, readyError(ctx, rctx, "create", err)
	}
	s := &session{p: p, r: p.remoteFor(id), workdir: workdir}
	if err := s.ping(rctx); err != nil {
		return nil, readyError(ctx, rctx, "create", err)
	}
	home, err := s.home(rctx)
	if err != nil {
		return nil, readyError(ctx, rctx, "create", err)
	}
	if wd := s.workdirAbs(home); wd != home {
		if err := s.mkdirAll(rctx, wd); err != nil {
			return nil, readyError(ctx, rctx, "create", err)
		}
	}
	return s, nil
}

// readyError reports a wait that ran into ReadyTimeout (not the caller's
// deadline) as a provider failure that still matches DeadlineExceeded.
func readyError(ctx, rctx context.Context, op string, err error) error {
	if ctx.Err() == nil && rctx.Err() != nil {
		return fmt.Errorf("opensandbox %s: not ready in time: %w", op, err)
	}
	return err
}

// waitState polls until the sandbox reaches want. States that can never
// lead there fail at once: a Failed sandbox is a provider error, a
// Terminated or Stopping one is gone.
func (p *Provider) waitState(ctx context.Context, id, op, want string) (apiSandbox, error) {
	bo := p.newBackoff()
	for {
		sb, err := p.getSandbox(ctx, id)
		if err != nil {
			return sb, err
		}
		switch st := sb.Status.State; {
		case st == want:
			return sb, nil
		case st == stateFailed:
			return sb, &workspace.ProviderError{Provider: providerName, Op: op, Code: sb.Status.Reason,
				Message: "sandbox failed: " + sb.Status.Message, Class: workspace.ErrProvider}
		case st == stateTerminated || st == stateStopping:
			return sb, fmt.Errorf("opensandbox %s: sandbox %s is %s: %w", op, id, st, workspace.ErrNotFound)
		}
		if err := bo.wait(ctx); err != nil {
			return sb, workspace.ContextError(ctx, "opensandbox "+op, err)
		}
	}
}

// cleanupCtx is a fresh context for work that must happen although the
// caller's ctx ended.
func (p *Provider) cleanupCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), p.cfg.CleanupTimeout)
}

// cleanup deletes a sandbox the caller will never see. A 404 may mean the
// runtime has not made its container yet (the Docker runtime answers 404 for
// a sandbox it is still provisioning), so a sandbox that still exists is
// waited for and deleted again.
func (p *Provider) cleanup(ctx context.Context, id string) {
	cctx, cancel := p.cleanupCtx(ctx)
	defer cancel()
	p.forget(id)
	bo := p.newBackoff()
	for {
		err := p.deleteSandbox(cctx, id)
		if err == nil {
			return
		}
		if isStatus(err, http.StatusNotFound) {
			sb, gerr := p.getSandbox(cctx, id)
			if gerr != nil || sb.Status.State == stateFailed || sb.Status.State == stateTerminated {
				return // gone, or a failed provision that holds nothing
			}
		}
		if bo.wait(cctx) != nil {
			return
		}
	}
}

// cleanupNonce deletes whatever sandbox a create with this nonce made. The
// server may still be handling the abandoned request, so it looks twice.
func (p *Provider) cleanupNonce(ctx context.Context, nonce string) {
	cctx, cancel := p.cleanupCtx(ctx)
	defer cancel()
	for i := 0; i < 2; i++ {
		if i > 0 && sleep(cctx, 2*p.cfg.PollInterval) != nil {
			return
		}
		sbs, err := p.listSandboxes(cctx, map[string]string{nonceKey: nonce})
		if err != nil {
			continue
		}
		for _, sb := range sbs {
			if sb.Metadata[nonceKey] == nonce {
				p.cleanup(cctx, sb.ID)
			}
		}
	}
}

// Attach returns a handle on an existing sandbox without changing its state:
// a paused sandbox gives a handle whose Run and file operations return
// workspace.ErrPaused until Resume. A sandbox still provisioning or resuming
// is waited for (up to ReadyTimeout).
func (p *Provider) Attach(ctx context.Context, id string) (workspace.Session, error) {
	if id == "" {
		return nil, fmt.Errorf("opensandbox attach: empty id: %w", workspace.ErrNotFound)
	}
	sb, err := p.getSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	switch sb.Status.State {
	case statePending, stateResuming:
		rctx, cancel := context.WithTimeout(ctx, p.cfg.ReadyTimeout)
		sb, err = p.waitState(rctx, id, "attach", stateRunning)
		cancel()
		if err != nil {
			return nil, readyError(ctx, rctx, "attach", err)
		}
	case stateTerminated, stateStopping:
		return nil, fmt.Errorf("opensandbox attach: sandbox %s is %s: %w", id, sb.Status.State, workspace.ErrNotFound)
	case stateFailed:
		return nil, &workspace.ProviderError{Provider: providerName, Op: "attach", Code: sb.Status.Reason,
			Message: "sandbox failed: " + sb.Status.Message, Class: workspace.ErrProvider}
	}
	r := p.remoteFor(id)
	r.setPaused(sb.Status.State == statePaused || sb.Status.State == statePausing)
	return &session{p: p, r: r, workdir: decodeWorkdir(sb.Metadata)}, nil
}

// Sessions lists the live sandboxes carrying Config.Metadata. Stopping,
// Terminated and Failed sandboxes hold nothing and are left out; the
// adapter's own metadata keys are hidden.
func (p *Provider) Sessions(ctx context.Context) ([]workspace.Info, error) {
	sbs, err := p.listSandboxes(ctx, p.cfg.Metadata)
	if err != nil {
		return nil, err
	}
	out := make([]workspace.Info, 0, len(sbs))
	for _, sb := range sbs {
		switch sb.Status.State {
		case stateStopping, stateTerminated, stateFailed:
			continue
		}
		if !hasAll(sb.Metadata, p.cfg.Metadata) {
			continue
		}
		md := map[string]string{}
		for k, v := range sb.Metadata {
			if _, own := p.cfg.Metadata[k]; own || strings.HasPrefix(k, reservedPrefix) {
				continue
			}
			md[k] = v
		}
		out = append(out, workspace.Info{
			ID:       sb.ID,
			Paused:   sb.Status.State == statePaused || sb.Status.State == statePausing,
			Metadata: md,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func hasAll(md, want map[string]string) bool {
	for k, v := range want {
		if md[k] != v {
			return false
		}
	}
	return true
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("opensandbox: random: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// The working directory is kept in metadata so Attach can restore it.
// Metadata values must be Kubernetes label values (63 characters of
// [A-Za-z0-9._-]), so the path is base32 (lower-case hex alphabet) encoded
// and split over numbered keys.
var workdirEncoding = base32.HexEncoding.WithPadding(base32.NoPadding)

const workdirChunk = 63

func encodeWorkdir(wd string) map[string]string {
	if wd == "" {
		return nil
	}
	enc := strings.ToLower(workdirEncoding.EncodeToString([]byte(wd)))
	out := map[string]string{}
	for i := 0; len(enc) > 0; i++ {
		n := min(workdirChunk, len(enc))
		out[workdirKey+"."+strconv.Itoa(i)] = enc[:n]
		enc = enc[n:]
	}
	return out
}

func decodeWorkdir(md map[string]string) string {
	var enc strings.Builder
	for i := 0; ; i++ {
		v, ok := md[workdirKey+"."+strconv.Itoa(i)]
		if !ok {
			break
		}
		enc.WriteString(v)
	}
	b, err := workdirEncoding.DecodeString(strings.ToUpper(enc.String()))
	if err != nil {
		return ""
	}
	return string(b)
}
