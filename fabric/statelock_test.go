package fabric

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/errdefs"
)

// TestStateLock: LockState holds the state dir as Open does, its ID is
// the same for every holder of the dir (made once, kept in the dir) and
// another dir's differs; Open takes a given lock over, and releases it when
// it fails (here: the lock of another dir) or closes.
func TestStateLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	l, err := LockState(dir)
	if err != nil {
		t.Fatal(err)
	}
	id := l.ID()
	if !strings.Contains(id, "@") || !strings.Contains(id, ":") || len(id) < 34 {
		t.Fatalf("state id %q, want <random>@<boot id>/<dev>:<ino>", id)
	}
	if _, err := LockState(dir); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("second LockState of a held dir: %v, want failed precondition", err)
	}
	if _, err := Open(context.Background(), Options{StateDir: dir}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Open of a dir LockState holds: %v, want failed precondition", err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if _, err := Open(context.Background(), testOptions(t, Options{StateDir: other, StateLock: l})); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Open with another dir's lock: %v, want invalid argument", err)
	}

	// Open failed, so it released l.
	l2, err := LockState(dir)
	if err != nil {
		t.Fatalf("LockState after a failed Open: %v", err)
	}
	if l2.ID() != id {
		t.Fatalf("state id changed: %q, then %q", id, l2.ID())
	}
	f, err := Open(context.Background(), testOptions(t, Options{StateDir: dir, StateLock: l2}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LockState(dir); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("LockState of an open dir: %v, want failed precondition", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	l3, err := LockState(dir)
	if err != nil {
		t.Fatalf("LockState after Close: %v", err)
	}
	defer l3.Close()
	if l3.ID() != id {
		t.Fatalf("state id changed: %q, then %q", id, l3.ID())
	}
	lo, err := LockState(other)
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Close()
	if lo.ID() == id {
		t.Fatal("two state dirs have one id")
	}
	// A copy of the dir, its state-id file included, is another holder.
	cp := filepath.Join(t.TempDir(), "copy")
	if err := os.MkdirAll(cp, 0o700); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, stateIDFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cp, stateIDFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	lc, err := LockState(cp)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	if lc.ID() == id {
		t.Fatalf("a copy of the state dir has its id %q", id)
	}
}
