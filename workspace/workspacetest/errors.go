package workspacetest

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

// testErrors: one error of every class a portable caller can provoke,
// side by side, each matching its class and no other (so a caller's
// errors.Is switch is unambiguous), with any *workspace.ProviderError in it
// filled in and agreeing with the class. The other subtests check the same
// per operation; this one is the taxonomy table in one place.
func (s *suite) testErrors(t *testing.T) {
	sess := s.create(t, nil)
	closed := s.create(t, nil)
	ctx := s.ctx(t)
	if err := sess.Write(ctx, "wst-errors/f", []byte("f")); err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	type check struct {
		name  string
		class error
		do    func() error
	}
	checks := []check{
		{"Attach(unknown id)", workspace.ErrNotFound, func() error {
			_, err := s.h.Provider.Attach(ctx, s.unknownID())
			if errors.Is(err, workspace.ErrUnsupported) {
				return nil // reported below
			}
			return err
		}},
		{"Run on a closed handle", workspace.ErrClosed, func() error {
			_, err := closed.Run(ctx, sandbox.Spec{}, "echo x")
			return err
		}},
		{"Read(missing)", fs.ErrNotExist, func() error { _, err := sess.Read(ctx, "wst-errors/missing"); return err }},
		{"Read(directory)", fs.ErrInvalid, func() error { _, err := sess.Read(ctx, "wst-errors"); return err }},
		{"Glob(bad pattern)", fs.ErrInvalid, func() error { _, err := sess.Glob(ctx, "["); return err }},
		{"Delete(/)", fs.ErrInvalid, func() error { return sess.Delete(ctx, "/") }},
		{"Run past Spec.Timeout", context.DeadlineExceeded, func() error {
			_, err := sess.Run(ctx, sandbox.Spec{Timeout: 100 * time.Millisecond}, s.longSleep())
			return err
		}},
		{"Run with a cancelled context", context.Canceled, func() error {
			_, err := sess.Run(cancelled, sandbox.Spec{}, "echo x")
			return err
		}},
		{"Read with a cancelled context", context.Canceled, func() error { _, err := sess.Read(cancelled, "wst-errors/f"); return err }},
		{"Attach with a cancelled context", context.Canceled, func() error {
			_, err := s.h.Provider.Attach(cancelled, sess.ID())
			return err
		}},
	}
	if _, ok := sess.(workspace.Pauser); ok {
		paused := s.create(t, nil)
		if err := paused.(workspace.Pauser).Pause(ctx); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		checks = append(checks, check{"Read while paused", workspace.ErrPaused, func() error {
			_, err := paused.Read(ctx, "x")
			return err
		}})
	}
	var provErrs int
	for _, c := range checks {
		err := c.do()
		if c.name == "Attach(unknown id)" && err == nil {
			t.Log("provider cannot attach: Attach(unknown id) not checked")
			continue
		}
		wantErr(t, c.name, err, c.class)
		var pe *workspace.ProviderError
		if errors.As(err, &pe) {
			provErrs++
		}
	}
	t.Logf("%d of %d errors carried a *workspace.ProviderError", provErrs, len(checks))
}
