package fabric

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas/s3"
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

// TestOpenFailureClosesWhatItOpened: an Open that fails after it opened the
// local store (and, with an asynchronous remote, the upload queue and its
// uploader; and the journal) closes them again: no descriptor into the
// state dir and no uploader outlive it, and the next Open succeeds.
func TestOpenFailureClosesWhatItOpened(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remote bool
		// breakState makes an open after the local store's fail.
		breakState func(state string) error
	}{
		{"journal", false, func(state string) error { return os.WriteFile(filepath.Join(state, "journal"), nil, 0o600) }},
		{"provenance key", false, func(state string) error { return os.Mkdir(filepath.Join(state, "provenance.key"), 0o700) }},
		{"journal after the upload queue", true, func(state string) error {
			return os.WriteFile(filepath.Join(state, "journal"), nil, 0o600)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			opts := Options{StateDir: state}
			if tc.remote {
				opts.Remote, opts.RemoteAsync = &s3.Store{}, true
			}
			uploaders := countGoroutines("cas/tier.(*Store).upload")
			if err := tc.breakState(state); err != nil {
				t.Fatal(err)
			}
			if f, err := Open(context.Background(), opts); err == nil {
				f.Close()
				t.Fatal("Open of a broken state dir succeeded")
			}
			if _, err := os.Stat(filepath.Join(state, "cas")); err != nil {
				t.Fatalf("the local store was not opened before the failure: the test proves nothing: %v", err)
			}
			if fds := openUnder(t, state); len(fds) > 0 {
				t.Errorf("descriptors into the state dir after a failed Open: %v", fds)
			}
			// The uploader is stopped before Close returns: no wait.
			if n := countGoroutines("cas/tier.(*Store).upload"); n > uploaders {
				t.Errorf("%d uploaders after a failed Open, %d before", n, uploaders)
			}
			if err := os.RemoveAll(filepath.Join(state, "journal")); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(state, "provenance.key")); err != nil {
				t.Fatal(err)
			}
			f, err := Open(context.Background(), opts)
			if err != nil {
				t.Fatalf("Open after a failed one: %v", err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// openUnder lists this process's descriptors that name dir or a path
// below it.
func openUnder(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && (p == dir || strings.HasPrefix(p, dir+"/")) {
			out = append(out, p)
		}
	}
	return out
}

// countGoroutines counts the goroutines whose stack names fn.
func countGoroutines(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fn)
		}
		buf = make([]byte, 2*len(buf))
	}
}
