package workspacetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// op is one session operation, for checks that every operation fails the
// same way (closed handle, paused session, session gone).
type op struct {
	name string
	do   func(ctx context.Context) error
}

// sessionOps are Run and every file operation, on file (which should exist
// for the operation to succeed). Delete comes last: where a broken provider
// lets it succeed, it does the least harm to the checks that follow.
func sessionOps(sess workspace.Session, file string) []op {
	return []op{
		{"Run", func(ctx context.Context) error {
			_, err := sess.Run(ctx, sandbox.Spec{}, "echo x")
			return err
		}},
		{"Read", func(ctx context.Context) error { _, err := sess.Read(ctx, file); return err }},
		{"Write", func(ctx context.Context) error { return sess.Write(ctx, file+".new", []byte("x")) }},
		{"List", func(ctx context.Context) error { _, err := sess.List(ctx, file); return err }},
		{"Glob", func(ctx context.Context) error { _, err := sess.Glob(ctx, "*"); return err }},
		{"Grep", func(ctx context.Context) error { _, err := sess.Grep(ctx, "x", vfs.GrepOptions{}); return err }},
		{"Upload", func(ctx context.Context) error { return sess.Upload(ctx, file+".up", strings.NewReader("x")) }},
		{"Download", func(ctx context.Context) error {
			rc, err := sess.Download(ctx, file)
			if err == nil {
				rc.Close()
			}
			return err
		}},
		{"Delete", func(ctx context.Context) error { return sess.Delete(ctx, file) }},
	}
}

// findInfo looks id up through the Enumerator.
func (s *suite) findInfo(t *testing.T, en workspace.Enumerator, id string) (workspace.Info, bool) {
	t.Helper()
	infos, err := en.Sessions(s.ctx(t))
	if err != nil {
		t.Fatalf("Sessions: %v", err)
	}
	for _, in := range infos {
		if in.ID == id {
			return in, true
		}
	}
	return workspace.Info{}, false
}

// unknownID is an id no provider hands out.
func (s *suite) unknownID() string {
	return fmt.Sprintf("workspacetest-no-such-session-%016x", s.seed)
}

// testLifecycle: Create gives a session with an ID that Attach finds (same
// files, both ways); Close is idempotent on its handle, which then answers
// ErrClosed to everything; other handles answer ErrNotFound; Attach of a
// closed or unknown id is ErrNotFound; the live count and the Enumerator
// follow.
func (s *suite) testLifecycle(t *testing.T) {
	n0 := s.mustCount(t)
	sess := s.create(t, nil)
	id := sess.ID()
	s.waitCount(t, n0+1, "after Create")
	en, hasEnum := s.h.Provider.(workspace.Enumerator)
	if hasEnum {
		info, ok := s.findInfo(t, en, id)
		switch {
		case !ok:
			t.Errorf("Sessions does not list the new session %s", id)
		case info.Paused:
			t.Errorf("Sessions lists new session %s as paused", id)
		case info.Metadata[MetadataKey] != label(t.Name()):
			t.Errorf("Sessions returns metadata %v for %s, want %s=%s among it", info.Metadata, id, MetadataKey, label(t.Name()))
		}
	}

	ctx := s.ctx(t)
	const first, second = "written through the first handle\n", "written through the second handle\n"
	if err := sess.Write(ctx, "lifecycle.txt", []byte(first)); err != nil {
		t.Fatalf("Write: %v", err)
	}
	other, err := s.h.Provider.Attach(ctx, id)
	canAttach := true
	switch {
	case errors.Is(err, workspace.ErrUnsupported):
		canAttach = false
		t.Logf("provider cannot attach (%v): attach checks skipped", err)
	case err != nil:
		t.Fatalf("Attach(%q): %v", id, err)
	case other == nil:
		t.Fatalf("Attach(%q) returned a nil session and no error", id)
	}
	if canAttach {
		if other.ID() != id {
			t.Errorf("Attach(%q).ID() = %q", id, other.ID())
		}
		if got, err := other.Read(ctx, "lifecycle.txt"); err != nil || string(got) != first {
			t.Errorf("Read through the attached handle = %q, %v; want %q", got, err, first)
		}
		if err := other.Write(ctx, "second.txt", []byte(second)); err != nil {
			t.Fatalf("Write through the attached handle: %v", err)
		}
		if got, err := sess.Read(ctx, "second.txt"); err != nil || string(got) != second {
			t.Errorf("first handle reads the attached handle's write as %q, %v; want %q", got, err, second)
		}
		if out := s.sh(t, other, "cat lifecycle.txt"); out != first {
			t.Errorf("cat through the attached handle = %q, want %q", out, first)
		}
	}

	if err := sess.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := sess.Close(ctx); err != nil {
		t.Errorf("second Close of the same handle = %v, want nil (Close is idempotent)", err)
	}
	if sess.ID() != id {
		t.Errorf("ID changed after Close: %q, was %q", sess.ID(), id)
	}
	for _, o := range sessionOps(sess, "lifecycle.txt") {
		wantErr(t, o.name+" on a closed handle", o.do(ctx), workspace.ErrClosed)
	}
	if pz, ok := sess.(workspace.Pauser); ok {
		wantErr(t, "Pause on a closed handle", pz.Pause(ctx), workspace.ErrClosed)
		wantErr(t, "Resume on a closed handle", pz.Resume(ctx), workspace.ErrClosed)
	}
	s.waitCount(t, n0, "after Close")
	if hasEnum {
		if _, ok := s.findInfo(t, en, id); ok {
			t.Errorf("Sessions still lists closed session %s", id)
		}
	}
	if !canAttach {
		return
	}
	for _, o := range sessionOps(other, "lifecycle.txt") {
		wantErr(t, o.name+" on another handle of a closed session", o.do(ctx), workspace.ErrNotFound)
	}
	wantErr(t, "Close of another handle of a closed session", other.Close(ctx), workspace.ErrNotFound)
	_, err = s.h.Provider.Attach(ctx, id)
	wantErr(t, "Attach to a closed session", err, workspace.ErrNotFound)
	_, err = s.h.Provider.Attach(ctx, s.unknownID())
	wantErr(t, "Attach to an unknown id", err, workspace.ErrNotFound)
}
