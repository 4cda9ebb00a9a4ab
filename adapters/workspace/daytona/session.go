package daytona

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"sync"

	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// Session is one Daytona sandbox. Its methods are safe for concurrent use.
type Session struct {
	p       *Provider
	id      string
	toolbox string // {toolboxProxyUrl}/{id}
	workDir string // Spec.WorkDir as given to Create, from the sandbox label

	closeMu sync.Mutex // serialises Close so a handle closes once

	mu        sync.Mutex
	closed    bool
	paused    bool   // the sandbox was last seen stopped/archived/paused
	home, cwd string // known once the toolbox answered
}

var (
	_ workspace.Session = (*Session)(nil)
	_ workspace.Pauser  = (*Session)(nil)
)

// ID is the Daytona sandbox id.
func (s *Session) ID() string { return s.id }

func (s *Session) setPaused(v bool) {
	s.mu.Lock()
	s.paused = v
	s.mu.Unlock()
}

// ready gates Run and the file operations: ErrClosed for a closed handle,
// ErrPaused while the sandbox is suspended (re-read from the API, so a
// Resume through another handle is seen), and the home and working
// directory, fetched from the toolbox once.
func (s *Session) ready(ctx context.Context, op string) (home, cwd string, err error) {
	s.mu.Lock()
	closed, paused, home, cwd := s.closed, s.paused, s.home, s.cwd
	s.mu.Unlock()
	if closed {
		return "", "", fmt.Errorf("daytona %s %s: %w", op, s.id, workspace.ErrClosed)
	}
	if paused {
		sb, err := s.p.get(ctx, op, s.id)
		if err != nil {
			return "", "", err
		}
		if err := s.judge(op, sb); err != nil {
			return "", "", err
		}
		if !sb.running() {
			return "", "", fmt.Errorf("daytona %s %s: sandbox is %s: %w", op, s.id, sb.State, workspace.ErrPaused)
		}
		s.setPaused(false)
	}
	if home != "" {
		return home, cwd, nil
	}
	var out struct {
		Dir string `json:"dir"`
	}
	if err := s.tbJSON(ctx, op, request{method: http.MethodGet, url: "/user-home-dir"}, &out); err != nil {
		return "", "", toolboxError(op, err)
	}
	if !path.IsAbs(out.Dir) {
		return "", "", &workspace.ProviderError{Provider: providerName, Op: op, Message: fmt.Sprintf("toolbox reported home directory %q", out.Dir)}
	}
	home, cwd = path.Clean(out.Dir), path.Clean(out.Dir)
	if s.workDir != "" {
		if cwd, err = vfs.Resolve(home, home, s.workDir); err != nil {
			return "", "", err
		}
	}
	s.mu.Lock()
	s.home, s.cwd = home, cwd
	s.mu.Unlock()
	return home, cwd, nil
}

// judge turns a sandbox that is gone or broken into the contract's error
// and remembers a suspended one.
func (s *Session) judge(op string, sb *sandboxInfo) error {
	switch {
	case sb.gone():
		return fmt.Errorf("daytona %s %s: sandbox was destroyed: %w", op, s.id, workspace.ErrNotFound)
	case sb.failed():
		return sb.failure(op)
	case sb.suspended():
		s.setPaused(true)
	}
	return nil
}

// tb sends a toolbox request (rq.url is the path below the sandbox's
// toolbox). When the answer could come from the proxy or runner rather
// than the daemon - they answer for a sandbox that is stopped or gone with
// 400/401/404 - the sandbox's state decides: ErrNotFound, ErrPaused, or
// the daemon's own error for the caller to map.
func (s *Session) tb(ctx context.Context, op string, rq request) (*http.Response, error) {
	rq.url = s.toolbox + rq.url
	resp, err := s.p.c.do(ctx, op, rq)
	if err == nil {
		return resp, nil
	}
	var he *httpError
	if errors.As(err, &he) && he.notFromDaemon() {
		sb, gerr := s.p.get(ctx, op, s.id)
		if gerr != nil {
			return nil, gerr
		}
		if jerr := s.judge(op, sb); jerr != nil {
			return nil, jerr
		}
		if sb.suspended() {
			return nil, fmt.Errorf("daytona %s %s: sandbox is %s: %w", op, s.id, sb.State, workspace.ErrPaused)
		}
	}
	return nil, err
}

func (s *Session) tbJSON(ctx context.Context, op string, rq request, out any) error {
	resp, err := s.tb(ctx, op, rq)
	if err != nil {
		return err
	}
	return decodeJSON(ctx, op, resp, out)
}

// notFromDaemon: the daemon's file handlers answer errors with a bare
// status; a JSON body, 401 or a gateway error may come from the proxy or
// the runner, which is how Daytona reports a sandbox that is not running.
func (he *httpError) notFromDaemon() bool {
	switch he.status {
	case http.StatusUnauthorized, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case http.StatusBadRequest, http.StatusForbidden, http.StatusNotFound, http.StatusGone:
		return he.hasBody
	}
	return false
}

// toolboxError maps a toolbox failure that is not about a file.
func toolboxError(op string, err error) error {
	var he *httpError
	if !errors.As(err, &he) {
		return err
	}
	var class error
	switch he.status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
		class = workspace.ErrPolicy
	}
	return he.provider(op, class)
}

// fsError maps a toolbox failure about path to the io/fs classes.
func fsError(op, p string, err error) error {
	var he *httpError
	if !errors.As(err, &he) {
		return err
	}
	var class error
	switch he.status {
	case http.StatusNotFound:
		class = fs.ErrNotExist
	case http.StatusForbidden:
		class = fs.ErrPermission
	case http.StatusConflict:
		class = fs.ErrExist
	case http.StatusUnauthorized, http.StatusTooManyRequests:
		class = workspace.ErrPolicy
	}
	return &fs.PathError{Op: op, Path: p, Err: he.provider(op, class)}
}

// Pause stops the sandbox (Daytona's stop: the file system is kept, running
// processes are not) and waits until it is stopped. Daytona's own pause,
// which keeps memory, exists only for VM sandbox classes and answers 422 for
// containers, so the adapter does not use it.
func (s *Session) Pause(ctx context.Context) error {
	if s.isClosed() {
		return fmt.Errorf("daytona pause %s: %w", s.id, workspace.ErrClosed)
	}
	for refused := 0; ; {
		sb, err := s.p.get(ctx, "pause", s.id)
		if err != nil {
			return err
		}
		if err := s.judge("pause", sb); err != nil {
			return err
		}
		switch {
		case sb.suspended() && sb.stable():
			s.setPaused(true)
			return nil
		case sb.running():
			err := s.p.c.doJSON(ctx, "pause", request{method: http.MethodPost, url: s.p.sandboxURL(s.id, "stop")}, nil)
			if err != nil {
				if err := s.refused(ctx, "pause", err, &refused); err != nil {
					return err
				}
				continue // the state moved under us; look again
			}
		}
		if err := s.settle(ctx, "pause"); err != nil {
			return err
		}
	}
}

// Resume starts a stopped, archived or paused sandbox and waits until it is
// started. The ID and the files are kept; processes are not.
func (s *Session) Resume(ctx context.Context) error {
	if s.isClosed() {
		return fmt.Errorf("daytona resume %s: %w", s.id, workspace.ErrClosed)
	}
	for refused := 0; ; {
		sb, err := s.p.get(ctx, "resume", s.id)
		if err != nil {
			return err
		}
		if err := s.judge("resume", sb); err != nil {
			return err
		}
		switch {
		case sb.running():
			s.setPaused(false)
			return nil
		case sb.stable():
			err := s.p.c.doJSON(ctx, "resume", request{method: http.MethodPost, url: s.p.sandboxURL(s.id, "start")}, nil)
			if err != nil {
				if err := s.refused(ctx, "resume", err, &refused); err != nil {
					return err
				}
				continue
			}
		}
		if err := s.settle(ctx, "resume"); err != nil {
			return err
		}
	}
}

// refused decides what a refused stop/start means: 409 (a state change in
// flight) and 400 (wrong state, usually because another client moved it
// between our read and our request) are looked at again a few times after
// a pause; anything else is the answer.
func (s *Session) refused(ctx context.Context, op string, err error, n *int) error {
	st := statusOf(err)
	if (st != http.StatusConflict && st != http.StatusBadRequest) || *n >= 5 {
		return apiError(op, err, true)
	}
	*n++
	if err := sleep(ctx, s.p.cfg.PollInterval<<*n); err != nil {
		return workspace.ContextError(ctx, "daytona "+op, err)
	}
	return nil
}

// settle waits until no state change is in flight.
func (s *Session) settle(ctx context.Context, op string) error {
	_, err := s.p.waitSandbox(ctx, op, s.id, func(sb *sandboxInfo) (bool, error) {
		if sb.gone() {
			return false, fmt.Errorf("daytona %s %s: sandbox was destroyed: %w", op, s.id, workspace.ErrNotFound)
		}
		return sb.stable(), nil
	})
	return err
}

func (s *Session) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close deletes the sandbox. Daytona refuses to delete during a state
// change (409), so Close waits for it to settle and tries again; a sandbox
// that is already being destroyed was closed by someone else: ErrNotFound.
// Close does not wait for destroying->destroyed: the sandbox stops counting
// against the account as soon as its deletion is accepted.
func (s *Session) Close(ctx context.Context) error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.isClosed() {
		return nil
	}
	err := s.closeRemote(ctx)
	if err == nil || errors.Is(err, workspace.ErrNotFound) {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
	}
	return err
}

func (s *Session) closeRemote(ctx context.Context) error {
	for {
		err := s.p.destroy(ctx, "close", s.id)
		switch statusOf(err) {
		case 0:
			return err // nil, or transport/ctx
		case http.StatusNotFound:
			return apiError("close", err, true)
		case http.StatusConflict:
			sb, gerr := s.p.get(ctx, "close", s.id)
			if gerr != nil {
				return gerr
			}
			if sb.gone() {
				return fmt.Errorf("daytona close %s: already being destroyed: %w", s.id, workspace.ErrNotFound)
			}
			if err := s.settle(ctx, "close"); err != nil {
				return err
			}
		default:
			return apiError("close", err, true)
		}
	}
}
