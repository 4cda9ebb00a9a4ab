package esf

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

func sessionIDs(t *testing.T, p *Provider) map[string]bool {
	t.Helper()
	infos, err := p.Sessions(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, in := range infos {
		out[in.ID] = in.Paused
	}
	return out
}

func TestPauseResumeAttach(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	meta := map[string]string{"owner": "test"}
	s := create(t, p, workspace.Spec{Metadata: meta, Env: map[string]string{"K": "v"}})
	if err := s.Write(ctx, "notes", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	sh(t, s, "echo run > /root/from-run")
	first := attemptOf(s)

	infos, err := p.Sessions(ctx)
	if err != nil || len(infos) != 1 || infos[0].ID != s.ID() || infos[0].Paused || !maps.Equal(infos[0].Metadata, meta) {
		t.Fatalf("sessions while running: %+v, %v", infos, err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Errorf("second pause: %v", err)
	}
	if st := attemptState(t, first); st != v1.AttemptReleased {
		t.Errorf("attempt after pause: %s", st)
	}
	if c := containers(t, first); len(c) > 0 {
		t.Errorf("containers after pause: %v", c)
	}
	if got := sessionIDs(t, p); len(got) != 1 || !got[s.ID()] {
		t.Errorf("sessions while paused: %v", got)
	}
	paused := []struct {
		name string
		do   func(workspace.Session) error
	}{
		{"run", func(s workspace.Session) error { _, err := s.Run(ctx, sandbox.Spec{}, "true"); return err }},
		{"read", func(s workspace.Session) error { _, err := s.Read(ctx, "notes"); return err }},
		{"write", func(s workspace.Session) error { return s.Write(ctx, "x", nil) }},
		{"list", func(s workspace.Session) error { _, err := s.List(ctx, "/"); return err }},
		{"download", func(s workspace.Session) error { _, err := s.Download(ctx, "notes"); return err }},
	}
	// Attach to the paused session changes nothing: its handle is paused too.
	a, err := p.Attach(ctx, s.ID())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []workspace.Session{s, a} {
		for _, tc := range paused {
			if err := tc.do(h); !errors.Is(err, workspace.ErrPaused) {
				t.Errorf("%s on a paused handle: %v", tc.name, err)
			}
		}
	}
	if got := sessionIDs(t, p); !got[s.ID()] {
		t.Errorf("attach resumed the session: %v", got)
	}
	// Resume through the attached handle: same id, same files, same env.
	if err := a.(workspace.Pauser).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if a.ID() != s.ID() {
		t.Errorf("id changed: %s -> %s", s.ID(), a.ID())
	}
	if got := sh(t, a.(*Session), "cat /root/notes /root/from-run; echo $K"); got != "keptrun\nv\n" {
		t.Errorf("after resume: %q", got)
	}
	// The first handle follows: the session runs again, whichever handle
	// resumed it.
	if b, err := s.Read(ctx, "notes"); err != nil || string(b) != "kept" {
		t.Errorf("old handle after a resume through another: %q, %v", b, err)
	}
	if attemptOf(s) != attemptOf(a.(*Session)) {
		t.Errorf("handles on different attempts: %s, %s", attemptOf(s), attemptOf(a.(*Session)))
	}
	if err := s.Resume(ctx); err != nil {
		t.Errorf("resume of a running session: %v", err)
	}
	// Close through one handle: the other finds the session gone.
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(ctx); err != nil {
		t.Errorf("second close of a handle: %v", err)
	}
	if _, err := a.Read(ctx, "notes"); !errors.Is(err, workspace.ErrClosed) {
		t.Errorf("read on a closed handle: %v", err)
	}
	if _, err := s.Read(ctx, "notes"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("read on a handle of a session closed elsewhere: %v", err)
	}
	if err := s.Close(ctx); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("close of a session closed elsewhere: %v", err)
	}
	if _, err := p.Attach(ctx, s.ID()); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("attach after close: %v", err)
	}
	if got := sessionIDs(t, p); len(got) != 0 {
		t.Errorf("sessions after close: %v", got)
	}
	noLeaks(t)
}

func TestAttachUnknown(t *testing.T) {
	p := newProvider(t)
	other := newProvider(t)
	s := create(t, other, workspace.Spec{})
	for _, id := range []string{"", "nope", "grp_00000000000000000000000000", "node_x", s.ID()} {
		if _, err := p.Attach(t.Context(), id); !errors.Is(err, workspace.ErrNotFound) {
			t.Errorf("attach %q: %v", id, err)
		}
	}
	if got := sessionIDs(t, p); len(got) != 0 {
		t.Errorf("another namespace's session listed: %v", got)
	}
}

// cutSweep cancels an operation at points all along its way: after 0,
// 1/6, 2/6, ... of took, the fastest of the runs it measured. The time an
// operation takes varies on a shared machine; when fewer than 4 of 8 tries
// were cut (the operation got faster than took), it sweeps again with half
// the step, up to three times. try runs the operation with a deadline d
// and reports whether it was cut, checking what it left behind itself.
func cutSweep(t *testing.T, what string, took time.Duration, try func(d time.Duration) (cut bool)) {
	t.Helper()
	step := took / 6
	cut := 0
	for range 3 {
		cut = 0
		for i := range 8 {
			if try(step * time.Duration(i)) {
				cut++
			}
		}
		if cut >= 4 {
			return
		}
		step /= 2
	}
	t.Errorf("only %d of 8 %s were cut with steps down to %v: the sweep missed its range (%v measured)", cut, what, step*2, took)
}

// fastest runs op n times and returns the shortest of the times it
// reported.
func fastest(n int, op func() time.Duration) time.Duration {
	best := op()
	for range n - 1 {
		best = min(best, op())
	}
	return best
}

// timed returns how long op took.
func timed(op func()) time.Duration {
	begin := time.Now()
	op()
	return time.Since(begin)
}

// TestCreateCancelledLeavesNothing cancels Create at points all along its
// way; whatever it got to, no session, attempt, lease or container is left.
func TestCreateCancelledLeavesNothing(t *testing.T) {
	p := newProvider(t)
	noLeaks(t)
	took := fastest(3, func() time.Duration {
		var s *Session
		took := timed(func() { s = create(t, p, workspace.Spec{}) })
		if err := s.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		return took
	})
	cutSweep(t, "creates", took, func(d time.Duration) bool {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		s, err := p.Create(ctx, workspace.Spec{})
		cancel()
		if err == nil {
			s.Close(t.Context())
			return false
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("create cut after %v: %v", d, err)
		}
		if got := sessionIDs(t, p); len(got) != 0 {
			t.Errorf("create cut after %v left sessions %v", d, got)
		}
		noLeaks(t)
		return true
	})
}

// TestResumeCancelledStaysPaused: a Resume cut at any point leaves the
// session paused, with its files, and no attempt or container.
func TestResumeCancelledStaysPaused(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	s := create(t, p, workspace.Spec{})
	if err := s.Write(ctx, "f", []byte("sealed")); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	took := fastest(3, func() time.Duration {
		took := timed(func() {
			if err := s.Resume(ctx); err != nil {
				t.Fatal(err)
			}
		})
		if err := s.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		return took
	})
	cutSweep(t, "resumes", took, func(d time.Duration) bool {
		cctx, cancel := context.WithTimeout(ctx, d)
		err := s.Resume(cctx)
		cancel()
		if err == nil {
			if err := s.Pause(ctx); err != nil {
				t.Fatal(err)
			}
			return false
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("resume cut after %v: %v", d, err)
		}
		if got := sessionIDs(t, p); len(got) != 1 || !got[s.ID()] {
			t.Errorf("resume cut after %v: sessions %v, want %s paused", d, got, s.ID())
		}
		noLeaks(t)
		return true
	})
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Read(ctx, "f"); err != nil || string(b) != "sealed" {
		t.Errorf("files after the cut resumes: %q, %v", b, err)
	}
}

// TestLeaseKeptAliveAndReclaimed: a session lives past its lease while it
// is used (each call renews, a running command keeps renewing), and the
// daemon reclaims it once nobody calls: then it is not found.
func TestLeaseKeptAliveAndReclaimed(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	s := create(t, p, workspace.Spec{Timeout: time.Second})
	if res, err := s.Run(ctx, sandbox.Spec{}, "sleep 2; echo done"); err != nil || string(res.Stdout) != "done\n" {
		t.Fatalf("command longer than the lease: %q, %v", res.Stdout, err)
	}
	for range 6 {
		time.Sleep(300 * time.Millisecond)
		if _, err := s.List(ctx, "/"); err != nil {
			t.Fatalf("call while in use: %v", err)
		}
	}
	att := attemptOf(s)
	deadline := time.Now().Add(10 * time.Second)
	for attemptState(t, att).Live() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if st := attemptState(t, att); st != v1.AttemptFailed {
		t.Fatalf("idle session's attempt: %s", st)
	}
	// The reaper stops the container after it records the expiry.
	for len(containers(t, att)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := p.Attach(ctx, s.ID()); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("attach to a reclaimed session: %v", err)
	}
	if _, err := s.Read(ctx, "/bin/sh"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("read on a reclaimed session: %v", err)
	}
	if got := sessionIDs(t, p); len(got) != 0 {
		t.Errorf("reclaimed session listed: %v", got)
	}
	if err := s.Close(ctx); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("close of a reclaimed session: %v", err)
	}
	noLeaks(t)
}

func TestMapErr(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()
	tests := []struct {
		ctx     context.Context
		code    errdefs.Code
		session bool
		want    error
		not     error
	}{
		{live, errdefs.CodeNotFound, true, workspace.ErrNotFound, workspace.ErrProvider},
		{live, errdefs.CodeInvalidArgument, true, workspace.ErrNotFound, nil},
		{live, errdefs.CodeNotFound, false, workspace.ErrProvider, workspace.ErrNotFound},
		{live, errdefs.CodeQuotaExceeded, false, workspace.ErrPolicy, nil},
		{live, errdefs.CodeDeadlineExceeded, false, context.DeadlineExceeded, context.Canceled},
		{live, errdefs.CodeUnsupported, false, workspace.ErrUnsupported, nil},
		{live, errdefs.CodeUnavailable, false, workspace.ErrProvider, nil},
		{live, errdefs.CodeConflict, false, workspace.ErrProvider, nil},
		{cancelled, errdefs.CodeDeadlineExceeded, false, context.Canceled, nil},
		{cancelled, errdefs.CodeUnavailable, false, context.Canceled, nil},
	}
	for _, tc := range tests {
		err := mapErr(tc.ctx, "op", &errdefs.Error{Code: tc.code, Message: "m"}, tc.session)
		if !errors.Is(err, tc.want) || tc.not != nil && errors.Is(err, tc.not) {
			t.Errorf("%s (session %v, ctx %v): %v; want %v, not %v", tc.code, tc.session, tc.ctx.Err(), err, tc.want, tc.not)
		}
		var pe *workspace.ProviderError
		if tc.ctx.Err() == nil && (!errors.As(err, &pe) || pe.Provider != ProviderName || pe.Code != string(tc.code)) {
			t.Errorf("%s: no *ProviderError with the code: %#v", tc.code, err)
		}
	}
	// File errors keep the io/fs classes.
	for _, tc := range []struct {
		errno error
		want  error
	}{{errNo(2), fs.ErrNotExist}, {errNo(17), fs.ErrExist}, {errNo(13), fs.ErrPermission}, {errNo(20), fs.ErrInvalid}, {errNo(5), workspace.ErrProvider}} {
		err := fsError("read", "/x", tc.errno)
		var pe *fs.PathError
		if !errors.Is(err, tc.want) || !errors.As(err, &pe) || pe.Path != "/x" {
			t.Errorf("%v: %v, want a *fs.PathError matching %v", tc.errno, err, tc.want)
		}
	}
}

func errNo(n int) error { return unix.Errno(n) }
