package workspacetest

import (
	"errors"
	"testing"

	"github.com/esf-dev/esf/workspace"
)

// testPause: for sessions that implement workspace.Pauser, Pause and Resume
// are idempotent; while paused, Run and every file operation answer
// ErrPaused; Attach to a paused session gives a handle that is paused too
// (attaching does not resume); Resume through any handle brings back the
// same ID with its files; a paused session can be closed.
func (s *suite) testPause(t *testing.T) {
	n0 := s.mustCount(t)
	sess := s.create(t, nil)
	pz, ok := sess.(workspace.Pauser)
	if !ok {
		t.Skipf("%T does not implement workspace.Pauser", sess)
	}
	id := sess.ID()
	ctx := s.ctx(t)
	const data = "survives a pause\n"
	if err := sess.Write(ctx, "wst-pause.txt", []byte(data)); err != nil {
		t.Fatal(err)
	}
	en, hasEnum := s.h.Provider.(workspace.Enumerator)
	wantPaused := func(want bool, when string) {
		t.Helper()
		if !hasEnum {
			return
		}
		info, ok := s.findInfo(t, en, id)
		if !ok {
			t.Errorf("%s: Sessions does not list %s", when, id)
		} else if info.Paused != want {
			t.Errorf("%s: Sessions reports Paused=%v, want %v", when, info.Paused, want)
		}
	}

	if err := pz.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := pz.Pause(ctx); err != nil {
		t.Errorf("second Pause = %v, want nil (no-op)", err)
	}
	wantPaused(true, "after Pause")
	for _, o := range sessionOps(sess, "wst-pause.txt") {
		wantErr(t, o.name+" while paused", o.do(ctx), workspace.ErrPaused)
	}

	resumer := pz
	other, err := s.h.Provider.Attach(ctx, id)
	switch {
	case errors.Is(err, workspace.ErrUnsupported):
		t.Logf("provider cannot attach (%v)", err)
	case err != nil:
		t.Fatalf("Attach to a paused session: %v", err)
	default:
		if other.ID() != id {
			t.Errorf("Attach(%q).ID() = %q", id, other.ID())
		}
		for _, o := range sessionOps(other, "wst-pause.txt")[:2] { // Run, Read
			wantErr(t, o.name+" on a handle attached while paused", o.do(ctx), workspace.ErrPaused)
		}
		wantPaused(true, "after Attach")
		op, ok := other.(workspace.Pauser)
		if !ok {
			t.Fatalf("an attached handle (%T) does not implement workspace.Pauser but the created one does", other)
		}
		resumer = op // resume through the other handle
	}

	if err := resumer.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := resumer.Resume(ctx); err != nil {
		t.Errorf("second Resume = %v, want nil (no-op)", err)
	}
	wantPaused(false, "after Resume")
	if sess.ID() != id {
		t.Errorf("ID after Resume = %q, was %q", sess.ID(), id)
	}
	if got, err := sess.Read(ctx, "wst-pause.txt"); err != nil || string(got) != data {
		t.Errorf("after Resume, Read = %q, %v; want %q", got, err, data)
	}
	if got := s.sh(t, sess, "cat wst-pause.txt"); got != data {
		t.Errorf("after Resume, cat = %q, want %q", got, data)
	}

	// A paused session can be closed, and then it is gone.
	if err := pz.Pause(ctx); err != nil {
		t.Fatalf("Pause again: %v", err)
	}
	if err := sess.Close(ctx); err != nil {
		t.Fatalf("Close of a paused session: %v", err)
	}
	s.waitCount(t, n0, "after closing a paused session")
	if _, err := s.h.Provider.Attach(ctx, id); !errors.Is(err, workspace.ErrUnsupported) {
		wantErr(t, "Attach to a paused session that was closed", err, workspace.ErrNotFound)
	}
}
