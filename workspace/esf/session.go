package esf

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/workspace"
)

// Session is one handle to an esf workspace session. Its methods are safe
// for concurrent use.
type Session struct {
	p   *Provider
	id  string
	rec record

	// lc serialises Pause, Resume and Close; mu guards what follows and is
	// never held across a call to the daemon.
	lc     sync.Mutex
	mu     sync.Mutex
	closed bool     // this handle was closed
	freed  bool     // and the session with it (Close is then a no-op)
	gone   bool     // the daemon no longer has the session
	busy   bool     // Pause or Resume under way: calls answer ErrPaused
	att    *attempt // the live attempt; nil when paused (or closed)
	ops    map[*op]struct{}
	// opsDone counts the operations in ops; Pause and Close wait for it
	// to drain after cancelling them, so no descriptor keeps the root
	// busy when the daemon unmounts it.
	opsDone sync.WaitGroup
}

var (
	_ workspace.Session = (*Session)(nil)
	_ workspace.Pauser  = (*Session)(nil)
)

// attempt is what a handle needs of its live attempt.
type attempt struct {
	id      string
	root    string // the writable root on this host
	leaseID string
	token   uint64
	ttl     time.Duration
	renewed time.Time // last renewal this handle made (or its adoption)
}

func newSession(p *Provider, id string, rec record) *Session {
	return &Session{p: p, id: id, rec: rec, ops: map[*op]struct{}{}}
}

// adopt makes av the handle's live attempt.
func (s *Session) adopt(av v1.AttemptView) {
	a := s.attemptOf(av)
	s.mu.Lock()
	s.att = a
	s.mu.Unlock()
}

func (s *Session) attemptOf(av v1.AttemptView) *attempt {
	a := &attempt{id: av.AttemptID, root: av.Root, ttl: time.Duration(s.rec.TTLMillis) * time.Millisecond, renewed: time.Now()}
	if av.Lease != nil {
		a.leaseID, a.token = av.Lease.LeaseID, av.Lease.Token
		a.ttl = time.Duration(av.Lease.TTLMillis) * time.Millisecond
		// The lease may be old (an Attach): renew at the first call.
		a.renewed = av.Lease.ExpiresAt.Add(-a.ttl)
	}
	return a
}

// ID is the session's esf group id: stable across Pause and Resume, and
// what Attach takes.
func (s *Session) ID() string { return s.id }

// op is one call in flight on a running session.
type op struct {
	s      *Session
	name   string
	parent context.Context // the caller's
	ctx    context.Context // parent, also cancelled (with a cause) by Pause and Close
	cancel context.CancelCauseFunc
	att    attempt
	once   sync.Once
}

// begin registers a call on the live attempt, renewing its lease when a
// third of it has passed. On a handle that says paused it first asks the
// daemon: another handle may have resumed the session.
func (s *Session) begin(ctx context.Context, name string) (*op, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for asked := false; ; asked = true {
		s.mu.Lock()
		if err := s.endedLocked(name); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		switch {
		case s.att == nil && (s.busy || asked):
			s.mu.Unlock()
			return nil, stateError(name, s.id, workspace.ErrPaused)
		case s.att == nil:
			s.mu.Unlock()
			if err := s.follow(ctx, name); err != nil {
				return nil, err
			}
			continue
		}
		o := &op{s: s, name: name, parent: ctx, att: *s.att}
		o.ctx, o.cancel = context.WithCancelCause(ctx)
		s.ops[o] = struct{}{}
		s.opsDone.Add(1)
		s.mu.Unlock()
		if s.claimRenewal(o.att.id) {
			if err := s.renew(o.ctx, o.att); err != nil {
				o.end()
				return nil, o.fail(err)
			}
		}
		return o, nil
	}
}

// follow brings a handle that says paused up to date with the daemon:
// running (resumed through another handle) adopts the live attempt;
// closed or reclaimed is ErrNotFound.
func (s *Session) follow(ctx context.Context, name string) error {
	f, err := s.p.lookup(ctx, name, s.id)
	var no *errNoSession
	switch {
	case errors.As(err, &no):
		s.mu.Lock()
		s.gone = true
		s.mu.Unlock()
		return stateError(name, s.id, workspace.ErrNotFound)
	case err != nil:
		return err
	case f.att != nil:
		s.mu.Lock()
		if s.att == nil && !s.busy && !s.closed {
			s.att = s.attemptOf(*f.att)
		}
		s.mu.Unlock()
	}
	return nil
}

// claimRenewal reports whether the lease of attempt id is due for renewal
// (a third of its TTL has passed) and, if so, marks it renewed now, so that
// concurrent calls renew once.
func (s *Session) claimRenewal(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.att == nil || s.att.id != id || s.att.leaseID == "" || time.Since(s.att.renewed) <= s.att.ttl/3 {
		return false
	}
	s.att.renewed = time.Now()
	return true
}

// end unregisters the call; it may be called more than once.
func (o *op) end() {
	o.once.Do(func() {
		o.cancel(nil)
		o.s.mu.Lock()
		delete(o.s.ops, o)
		o.s.mu.Unlock()
		o.s.opsDone.Done()
	})
}

// stopOps cancels every call in flight with cause (ErrPaused, ErrClosed).
// Called with mu held.
func (s *Session) stopOps(cause error) {
	for o := range s.ops {
		o.cancel(cause)
	}
}

// fail turns the error of a call into what the caller sees: the handle's
// reason when Pause or Close cut the call, the caller's context error when
// that ended, and, when the attempt vanished under the call (another
// handle paused or closed the session, or its lease expired), the
// session's state as the daemon now tells it.
func (o *op) fail(err error) error {
	if err == nil {
		return nil
	}
	if o.parent.Err() == nil && o.ctx.Err() != nil {
		if cause := context.Cause(o.ctx); isStateClass(cause) {
			return stateError(o.name, o.s.id, cause)
		}
	}
	if o.parent.Err() != nil {
		return workspace.ContextError(o.parent, ProviderName+" "+o.name, err)
	}
	if attemptGone(err) {
		if serr := o.s.recheck(o.parent, o.name, o.att.id); serr != nil {
			return serr
		}
	}
	return err
}

// attemptGone reports an error that may mean the attempt is no longer
// live: its root unmounted, its container or lease gone.
func attemptGone(err error) bool {
	if errors.Is(err, errRootGone) {
		return true
	}
	var pe *workspace.ProviderError
	if errors.As(err, &pe) {
		switch errdefs.Code(pe.Code) {
		case errdefs.CodeFailedPrecondition, errdefs.CodeNotFound, errdefs.CodeStaleGeneration:
			return true
		}
	}
	return false
}

// recheck asks the daemon what became of the session after a call on
// attempt failed, updates the handle, and returns the class to report:
// ErrNotFound (closed or reclaimed), ErrPaused (paused by another handle),
// or nil (still running: the failure was the call's own).
func (s *Session) recheck(parent context.Context, op, attemptID string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 30*time.Second)
	defer cancel()
	f, err := s.p.lookup(ctx, op, s.id)
	var no *errNoSession
	if errors.As(err, &no) {
		s.mu.Lock()
		s.gone, s.att = true, nil
		s.mu.Unlock()
		return stateError(op, s.id, workspace.ErrNotFound)
	}
	if err != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Only the handle's view of this attempt changes; a Pause, Resume or
	// Close of this handle under way owns the rest.
	if s.att == nil || s.att.id != attemptID || s.busy || s.closed {
		if f.att == nil {
			return stateError(op, s.id, workspace.ErrPaused)
		}
		return nil
	}
	if f.att == nil {
		s.att = nil
		return stateError(op, s.id, workspace.ErrPaused)
	}
	if f.att.AttemptID != attemptID {
		// Paused and resumed by another handle: follow the new attempt.
		s.att = s.attemptOf(*f.att)
	}
	return nil
}

// renew extends the attempt's lease by its TTL.
func (s *Session) renew(ctx context.Context, a attempt) error {
	_, err := s.p.c.Renew(ctx, v1.RenewRequest{LeaseID: a.leaseID, Token: a.token, TTLMillis: a.ttl.Milliseconds()}, client.CallOptions{})
	if err != nil {
		return mapErr(ctx, "renew", err, false)
	}
	return nil
}

// keepAlive renews the lease every third of its TTL until the returned
// stop is called: a command may run longer than the lease.
func (o *op) keepAlive() (stop func()) {
	if o.att.leaseID == "" || o.att.ttl <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(max(o.att.ttl/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-o.ctx.Done():
				return
			case <-t.C:
				if o.s.renew(o.ctx, o.att) == nil {
					o.s.mu.Lock()
					if o.s.att != nil && o.s.att.id == o.att.id {
						o.s.att.renewed = time.Now()
					}
					o.s.mu.Unlock()
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// endedLocked is op's error on a handle that was closed or whose session
// is gone, nil otherwise; s.mu is held.
func (s *Session) endedLocked(op string) error {
	switch {
	case s.closed:
		return stateError(op, s.id, workspace.ErrClosed)
	case s.gone:
		return stateError(op, s.id, workspace.ErrNotFound)
	}
	return nil
}

// Pause seals the session's files into a node (esf suspend) and releases
// its attempt: the container and its processes end, the lease goes, and
// the session costs nothing but its stored files. Calls in flight on this
// handle are cut with ErrPaused first. Pausing a paused session is a
// no-op.
func (s *Session) Pause(ctx context.Context) error {
	s.lc.Lock()
	defer s.lc.Unlock()
	s.mu.Lock()
	if err := s.endedLocked("pause"); err != nil {
		s.mu.Unlock()
		return err
	}
	if s.att == nil {
		s.mu.Unlock()
		return nil
	}
	a := *s.att
	s.att, s.busy = nil, true // new calls: ErrPaused
	s.stopOps(workspace.ErrPaused)
	s.mu.Unlock()
	defer s.setBusy(false)
	s.opsDone.Wait()

	_, err := s.p.c.Suspend(ctx, v1.SuspendRequest{AttemptID: a.id}, keyed(newKey("suspend")))
	if err == nil {
		return nil
	}
	return s.settle(ctx, "pause", a, mapErr(ctx, "pause", err, false))
}

// settle brings the handle in line with the daemon after a failed Pause:
// still running (the seal was cut and rolled back), paused after all (the
// seal committed; a sealed attempt left unreleased is released), or gone.
func (s *Session) settle(ctx context.Context, op string, a attempt, err error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.p.cleanup)
	defer cancel()
	f, lerr := s.p.lookup(cctx, op, s.id)
	var no *errNoSession
	switch {
	case errors.As(lerr, &no):
		s.mu.Lock()
		s.gone = true
		s.mu.Unlock()
		return stateError(op, s.id, workspace.ErrNotFound)
	case lerr != nil:
		// Unknown: keep the handle running on a; a later call finds out.
		s.mu.Lock()
		s.att = &a
		s.mu.Unlock()
		return err
	case f.att != nil:
		s.adopt(*f.att)
		return err
	}
	if in, ierr := s.p.c.Inspect(cctx, a.id, client.CallOptions{}); ierr == nil && in.Attempt != nil && in.Attempt.State == v1.AttemptSealed {
		s.p.c.Release(cctx, v1.ReleaseRequest{AttemptID: a.id}, client.CallOptions{})
	}
	return nil
}

// Resume starts a new attempt on the session's last seal (a fresh draft
// forked off it), with the session's environment and limits. Files are
// those of the seal; processes are not restored. Resuming a running
// session is a no-op (another handle may have resumed it: this one
// follows). If Resume fails or ctx ends, what it made is released and the
// session stays paused.
func (s *Session) Resume(ctx context.Context) error {
	s.lc.Lock()
	defer s.lc.Unlock()
	s.mu.Lock()
	if err := s.endedLocked("resume"); err != nil {
		s.mu.Unlock()
		return err
	}
	if s.att != nil {
		s.mu.Unlock()
		return nil
	}
	s.busy = true
	s.mu.Unlock()
	defer s.setBusy(false)
	f, err := s.p.lookup(ctx, "resume", s.id)
	if err != nil {
		var no *errNoSession
		if errors.As(err, &no) {
			s.mu.Lock()
			s.gone = true
			s.mu.Unlock()
		}
		return err
	}
	if f.att != nil {
		s.adopt(*f.att)
		return nil
	}
	u := undo{rec: s.rec}
	if err := s.p.startOn(ctx, &u, f.node); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.p.cleanup)
		defer cancel()
		if cerr := s.p.undo(cctx, &u, false); cerr != nil {
			err = withCleanup(err, cerr)
		}
		return err
	}
	s.adopt(*u.att)
	return nil
}

// Close releases the session's attempt (without sealing: its unsealed
// work is dropped), marks the session closed with a tombstone node and
// prunes its seals so the daemon can collect them. Calls in flight on this
// handle are cut with ErrClosed; every later call returns ErrClosed.
// Closing twice is a no-op; closing a session another handle closed (or
// the daemon reclaimed) is ErrNotFound. If the daemon could not be told,
// the handle is closed all the same and a second Close tries again.
func (s *Session) Close(ctx context.Context) error {
	s.lc.Lock()
	defer s.lc.Unlock()
	s.mu.Lock()
	if s.freed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.att = nil
	s.stopOps(workspace.ErrClosed)
	s.mu.Unlock()
	s.opsDone.Wait()

	f, err := s.p.lookup(ctx, "close", s.id)
	var no *errNoSession
	if errors.As(err, &no) {
		s.mu.Lock()
		s.freed = true
		s.mu.Unlock()
		if g := no.reclaimed; g != nil {
			// Nothing runs, but close it for good so that its seals
			// can be collected.
			s.p.closeGroup(ctx, g.GroupID, g.RootNodeID)
		}
		return stateError("close", s.id, workspace.ErrNotFound)
	}
	if err != nil {
		return err
	}
	for _, d := range f.drafts {
		if err := s.p.releaseAll(ctx, d); err != nil {
			return err
		}
	}
	if err := s.p.closeGroup(ctx, f.group.GroupID, f.group.RootNodeID); err != nil {
		return err
	}
	s.mu.Lock()
	s.freed = true
	s.mu.Unlock()
	return nil
}

func (s *Session) setBusy(b bool) {
	s.mu.Lock()
	s.busy = b
	s.mu.Unlock()
}

func closeFD(fd int) { unix.Close(fd) }
