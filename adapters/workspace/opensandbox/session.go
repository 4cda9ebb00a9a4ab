package opensandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"sync"

	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// session is one handle on a sandbox. Handles on the same sandbox from the
// same Provider share a *remote; closing is per handle.
type session struct {
	p       *Provider
	r       *remote
	workdir string // Spec.WorkDir as given; resolved against home when used

	mu     sync.Mutex
	closed bool
}

var (
	_ workspace.Session = (*session)(nil)
	_ workspace.Pauser  = (*session)(nil)
)

func (s *session) ID() string { return s.r.id }

func (s *session) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// begin is the gate every Run and file operation passes: a closed handle is
// ErrClosed, a paused sandbox ErrPaused, both without a network call.
func (s *session) begin(op string) error {
	if s.isClosed() {
		return fmt.Errorf("opensandbox %s %s: %w", op, s.r.id, workspace.ErrClosed)
	}
	switch paused, gone := s.r.state(); {
	case gone:
		return fmt.Errorf("opensandbox %s %s: closed through another handle: %w", op, s.r.id, workspace.ErrNotFound)
	case paused:
		return fmt.Errorf("opensandbox %s %s: %w", op, s.r.id, workspace.ErrPaused)
	}
	return nil
}

// home is the sandbox user's home: Config.Home, or what execd expands "~"
// to, asked once per sandbox.
func (s *session) home(ctx context.Context) (string, error) {
	if s.p.cfg.Home != "" {
		return s.p.cfg.Home, nil
	}
	s.r.mu.Lock()
	h := s.r.home
	s.r.mu.Unlock()
	if h != "" {
		return h, nil
	}
	fi, err := s.stat(ctx, "~")
	if err != nil {
		return "", fmt.Errorf("opensandbox: find home directory: %w", err)
	}
	if fi.Path == "" || fi.Path[0] != '/' {
		return "", &workspace.ProviderError{Provider: providerName, Op: "stat", Message: fmt.Sprintf("home %q is not absolute", fi.Path), Class: workspace.ErrProvider}
	}
	s.r.mu.Lock()
	s.r.home = fi.Path
	s.r.mu.Unlock()
	return fi.Path, nil
}

// workdirAbs is the session's working directory given home.
func (s *session) workdirAbs(home string) string {
	if s.workdir == "" {
		return home
	}
	wd, err := vfs.Resolve(home, home, s.workdir)
	if err != nil {
		return home
	}
	return wd
}

// resolve applies the contract's path rule to p. execd expands $NAME and
// ${NAME} in every path it is given, with no way to escape a "$", so a path
// holding one is refused rather than silently read or written elsewhere.
func (s *session) resolve(ctx context.Context, p string) (string, error) {
	home, err := s.home(ctx)
	if err != nil {
		return "", err
	}
	abs, err := vfs.Resolve(home, s.workdirAbs(home), p)
	if err != nil {
		return "", err
	}
	if strings.Contains(abs, "$") {
		return "", &fs.PathError{Op: "resolve", Path: p, Err: fmt.Errorf("execd would expand the $ in it: %w", fs.ErrInvalid)}
	}
	return abs, nil
}

// classify explains a failed execd call. Errors that already say what
// happened pass through; a provider or transport failure is checked against
// the sandbox's state, because a sandbox paused through another client (or
// deleted) shows up at execd only as a hung or refused connection.
func (s *session) classify(ctx context.Context, op string, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	if !errors.Is(err, workspace.ErrProvider) {
		return err
	}
	gctx, cancel := context.WithTimeout(ctx, s.p.cfg.CleanupTimeout)
	defer cancel()
	sb, gerr := s.p.getSandbox(gctx, s.r.id)
	switch {
	case errors.Is(gerr, workspace.ErrNotFound):
		return fmt.Errorf("opensandbox %s: %w (%v)", op, workspace.ErrNotFound, err)
	case gerr != nil:
		return err
	}
	switch sb.Status.State {
	case statePaused, statePausing, stateResuming:
		if sb.Status.State != stateResuming {
			s.r.setPaused(true)
		}
		return fmt.Errorf("opensandbox %s: sandbox is %s: %w (%v)", op, sb.Status.State, workspace.ErrPaused, err)
	case stateStopping, stateTerminated:
		return fmt.Errorf("opensandbox %s: sandbox is %s: %w (%v)", op, sb.Status.State, workspace.ErrNotFound, err)
	}
	return err
}

// Close deletes the sandbox. A second Close on this handle is a no-op; a
// Close after another handle deleted it is workspace.ErrNotFound. A failed
// Close leaves the handle open so it can be retried.
func (s *session) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	err := s.p.deleteSandbox(ctx, s.r.id)
	if err != nil && !errors.Is(err, workspace.ErrNotFound) {
		return err
	}
	s.closed = true
	s.p.forget(s.r.id)
	s.r.mu.Lock()
	s.r.gone, s.r.paused, s.r.ep = true, false, nil
	s.r.mu.Unlock()
	return err
}

// Pause asks for Running -> Pausing -> Paused and polls until Paused. Every
// handle of this Provider on the sandbox answers ErrPaused from the moment
// the request is made.
func (s *session) Pause(ctx context.Context) error {
	return s.transition(ctx, "pause")
}

// Resume asks for Paused -> Resuming -> Running, polls until Running and
// waits for execd to answer again.
func (s *session) Resume(ctx context.Context) error {
	return s.transition(ctx, "resume")
}

func (s *session) transition(ctx context.Context, verb string) error {
	if s.isClosed() {
		return fmt.Errorf("opensandbox %s %s: %w", verb, s.r.id, workspace.ErrClosed)
	}
	pause := verb == "pause"
	// from is the state the verb applies to, to the one it leads to, via
	// the transient state in between.
	from, via, to := stateRunning, statePausing, statePaused
	if !pause {
		from, via, to = statePaused, stateResuming, stateRunning
	}
	bo := s.p.newBackoff()
	requested := false
	for {
		sb, err := s.p.getSandbox(ctx, s.r.id)
		if err != nil {
			return err
		}
		switch st := sb.Status.State; {
		case st == to:
			s.r.setPaused(pause)
			if !pause {
				return s.ping(ctx)
			}
			return nil
		case st == from && !requested:
			if pause {
				s.r.setPaused(true)
			}
			err := s.p.transition(ctx, s.r.id, verb)
			switch {
			case err == nil:
				requested = true
				continue
			case isStatus(err, http.StatusConflict):
				// The state moved under us (another client); look again.
			default:
				if pause {
					s.r.setPaused(false)
				}
				return err
			}
		case st == stateFailed:
			return &workspace.ProviderError{Provider: providerName, Op: verb, Code: sb.Status.Reason,
				Message: "sandbox failed: " + sb.Status.Message, Class: workspace.ErrProvider}
		case st == stateTerminated || st == stateStopping:
			return fmt.Errorf("opensandbox %s: sandbox %s is %s: %w", verb, s.r.id, st, workspace.ErrNotFound)
		case st == via, st == stateRunning, st == statePaused, st == statePending,
			st == statePausing, st == stateResuming:
			// In flight, ours or someone else's (Resuming while we pause,
			// Pausing while we resume): wait for it to settle.
		}
		if err := bo.wait(ctx); err != nil {
			return workspace.ContextError(ctx, "opensandbox "+verb, err)
		}
	}
}

// ping waits for execd to answer /ping; a just-started or just-resumed
// sandbox may refuse connections for a moment.
func (s *session) ping(ctx context.Context) error {
	bo := s.p.newBackoff()
	for {
		resp, err := s.execd(ctx, call{op: "ping", method: http.MethodGet, idempotent: true}, "/ping")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if errors.Is(err, workspace.ErrPolicy) || errors.Is(err, workspace.ErrNotFound) {
			return err
		}
		if werr := bo.wait(ctx); werr != nil {
			return workspace.ContextError(ctx, "opensandbox ping", fmt.Errorf("%w (last: %v)", werr, err))
		}
	}
}

// fileError wraps a file operation's failure the io/fs way.
func fileError(op, path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	return &fs.PathError{Op: op, Path: path, Err: err}
}
