package fabric

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/errdefs"
)

// TestOpenMakesStatePrivate: Open strips group and other bits from a state
// dir created with open modes, down to its deepest file, leaves symlink
// targets alone, and umount refuses what lies inside the state dir.
func TestOpenMakesStatePrivate(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	deep := filepath.Join(state, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]os.FileMode{
		filepath.Join(state, "top"):   0o644,
		filepath.Join(deep, "file"):   0o664,
		filepath.Join(deep, "ro"):     0o444,
		filepath.Join(deep, "script"): 0o755,
	} {
		if err := os.WriteFile(p, []byte("x"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(deep, "link")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{state, filepath.Join(state, "a"), deep} {
		os.Chmod(p, 0o755)
	}
	f, err := Open(context.Background(), Options{StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]os.FileMode{
		state: 0o700, filepath.Join(state, "a"): 0o700, deep: 0o700,
		filepath.Join(state, "top"): 0o600, filepath.Join(deep, "file"): 0o600,
		filepath.Join(deep, "ro"): 0o400, filepath.Join(deep, "script"): 0o700,
		outside: 0o644,
	}
	for p, m := range want {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != m {
			t.Errorf("%s: mode %o, want %o", p, fi.Mode().Perm(), m)
		}
	}
	if _, err := os.Stat(filepath.Join(state, privateMarker)); err != nil {
		t.Errorf("no marker after the full walk: %v", err)
	}

	for _, dir := range []string{filepath.Join(state, "mnt"), filepath.Join(state, "attempts", "x", "root"), state} {
		if _, err := f.Umount(context.Background(), UmountRequest{Dir: dir}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("umount %s: %v, want invalid_argument", dir, err)
		}
	}
}
