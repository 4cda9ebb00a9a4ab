package fake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// Op names an operation for Options.Fault.
type Op string

// The operations Options.Fault sees, one per Provider and Session method.
const (
	OpCreate   Op = "create"
	OpAttach   Op = "attach"
	OpSessions Op = "sessions"
	OpClose    Op = "close"
	OpPause    Op = "pause"
	OpResume   Op = "resume"
	OpRun      Op = "run"
	OpRead     Op = "read"
	OpWrite    Op = "write"
	OpList     Op = "list"
	OpGlob     Op = "glob"
	OpGrep     Op = "grep"
	OpDelete   Op = "delete"
	OpUpload   Op = "upload"
	OpDownload Op = "download"
)

// Name is the Provider field of the *workspace.ProviderError values the fake
// returns.
const Name = "fake"

// DefaultHome is the home directory when Options.Home is "".
const DefaultHome = "/home/user"

// Options configures a Provider. The zero value is ready to use.
type Options struct {
	// Home is every session's home directory (absolute); "" means
	// DefaultHome.
	Home string
	// Fault, when set, is called by every operation after the handle and
	// ctx checks and before it acts, with the session id (the id asked for
	// by Attach, "" for Sessions). A non-nil error fails the operation with
	// that error wrapped; Fault may block, honouring ctx, to make an
	// operation slow.
	// Create calls it after the session exists, where a real provider
	// would be booting it, so a Fault that fails or outlives ctx there
	// exercises the cleanup of a half-made session. Fault is called
	// concurrently when operations are.
	Fault func(ctx context.Context, op Op, id string) error
	// Now is the clock for modification times and Spec.Timeout; nil means
	// time.Now.
	Now func() time.Time
}

// Validate reports whether the options can make a Provider.
func (o Options) Validate() error {
	if o.Home != "" && (!strings.HasPrefix(o.Home, "/") || strings.IndexByte(o.Home, 0) >= 0) {
		return fmt.Errorf("fake: home %q is not an absolute path: %w", o.Home, fs.ErrInvalid)
	}
	return nil
}

// Provider is the in-memory workspace.Provider. It also implements
// workspace.Enumerator; its sessions implement workspace.Pauser.
type Provider struct {
	home  string
	fault func(ctx context.Context, op Op, id string) error
	now   func() time.Time

	mu       sync.Mutex
	sessions map[string]*state // live sessions; guards every state's lifecycle fields
}

var (
	_ workspace.Provider   = (*Provider)(nil)
	_ workspace.Enumerator = (*Provider)(nil)
)

// New returns an empty Provider.
func New(opts Options) (*Provider, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	p := &Provider{home: DefaultHome, fault: opts.Fault, now: opts.Now, sessions: map[string]*state{}}
	if opts.Home != "" {
		p.home = strings.TrimSuffix(opts.Home, "/")
		if p.home == "" {
			p.home = "/"
		}
	}
	if p.now == nil {
		p.now = time.Now
	}
	return p, nil
}

// state is one session, shared by all its handles. The lifecycle fields are
// guarded by Provider.mu, the file tree by tree's own lock.
type state struct {
	id        string
	home, cwd string
	env       map[string]string
	meta      map[string]string
	timeout   time.Duration

	// Guarded by Provider.mu.
	gone     bool
	paused   bool
	deadline time.Time // zero: never expires

	tree *tree
}

// Create implements workspace.Provider. The session exists (and counts in
// Live) from before the Fault call until Create fails or returns it.
func (p *Provider) Create(ctx context.Context, spec workspace.Spec) (workspace.Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fake create: %w", err)
	}
	cwd := p.home
	if spec.WorkDir != "" {
		var err error
		if cwd, err = vfs.Resolve(p.home, p.home, spec.WorkDir); err != nil {
			return nil, fmt.Errorf("fake create: workdir: %w", err)
		}
	}
	now := p.now()
	st := &state{
		id:      newID(),
		home:    p.home,
		cwd:     cwd,
		env:     map[string]string{"HOME": p.home, "PATH": "/usr/local/bin:/usr/bin:/bin", "USER": "user"},
		meta:    maps.Clone(spec.Metadata),
		timeout: spec.Timeout,
		tree:    newTree(now),
	}
	maps.Copy(st.env, spec.Env)
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{"/tmp", fs.ModeDir | fs.ModeSticky | 0o777}, {p.home, fs.ModeDir | 0o755}, {cwd, fs.ModeDir | 0o755}} {
		if err := st.tree.mkdirAll(d.path, d.mode, now); err != nil {
			return nil, fmt.Errorf("fake create: %w", err)
		}
	}
	if spec.Timeout > 0 {
		st.deadline = now.Add(spec.Timeout)
	}

	p.mu.Lock()
	p.sessions[st.id] = st
	p.mu.Unlock()

	err := p.callFault(ctx, OpCreate, st.id)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		p.remove(st.id)
		return nil, fmt.Errorf("fake create %s: %w", st.id, err)
	}
	return &Session{p: p, st: st}, nil
}

// Attach implements workspace.Provider. It never changes the session's
// state.
func (p *Provider) Attach(ctx context.Context, id string) (workspace.Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fake attach %s: %w", id, err)
	}
	if err := p.callFault(ctx, OpAttach, id); err != nil {
		return nil, fmt.Errorf("fake attach %s: %w", id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweepLocked()
	st, ok := p.sessions[id]
	if !ok {
		return nil, notFound(OpAttach, id)
	}
	return &Session{p: p, st: st}, nil
}

// Sessions implements workspace.Enumerator, sorted by ID.
func (p *Provider) Sessions(ctx context.Context) ([]workspace.Info, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fake sessions: %w", err)
	}
	if err := p.callFault(ctx, OpSessions, ""); err != nil {
		return nil, fmt.Errorf("fake sessions: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweepLocked()
	out := make([]workspace.Info, 0, len(p.sessions))
	for _, st := range p.sessions {
		out = append(out, workspace.Info{ID: st.id, Paused: st.paused, Metadata: maps.Clone(st.meta)})
	}
	slices.SortFunc(out, func(a, b workspace.Info) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Live is the number of live sessions (paused ones included): the count the
// conformance suite's leak checks compare.
func (p *Provider) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweepLocked()
	return len(p.sessions)
}

func (p *Provider) callFault(ctx context.Context, op Op, id string) error {
	if p.fault == nil {
		return nil
	}
	return p.fault(ctx, op, id)
}

// remove deletes a live session; false when it was already gone.
func (p *Provider) remove(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	st, ok := p.sessions[id]
	if ok {
		st.gone = true
		delete(p.sessions, id)
	}
	return ok
}

// sweepLocked reclaims running sessions past their Spec.Timeout. It runs
// whenever someone looks, so no timer goroutine is needed.
func (p *Provider) sweepLocked() {
	now := p.now()
	for id, st := range p.sessions {
		if !st.paused && !st.deadline.IsZero() && !now.Before(st.deadline) {
			st.gone = true
			delete(p.sessions, id)
		}
	}
}

// usable reports why st cannot serve a Run or a file operation, if it
// cannot: reclaimed or closed (ErrNotFound) or paused (ErrPaused).
func (p *Provider) usable(st *state, op Op) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweepLocked()
	switch {
	case st.gone:
		return notFound(op, st.id)
	case st.paused:
		return &workspace.ProviderError{Provider: Name, Op: string(op), Code: "paused", Message: "session " + st.id + " is paused", Class: workspace.ErrPaused}
	}
	return nil
}

func notFound(op Op, id string) error {
	return &workspace.ProviderError{Provider: Name, Op: string(op), Code: "not_found", Message: fmt.Sprintf("session %q not found", id), Class: workspace.ErrNotFound}
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "fk-" + hex.EncodeToString(b[:])
}

// errClosed is what a closed handle answers.
func errClosed(op Op, id string) error {
	return fmt.Errorf("fake %s %s: %w", op, id, workspace.ErrClosed)
}
