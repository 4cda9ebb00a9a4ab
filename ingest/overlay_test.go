package ingest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUpperMatchesMergedTree seals a hand-made overlay upper directory
// (new, modified, chmod-only files, a whiteout, an opaque directory, an
// excluded executor mountpoint) onto a base and checks the result equals
// the import of the merged tree built by hand.
func TestUpperMatchesMergedTree(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	st := newStore()
	base, merged, upper := t.TempDir(), t.TempDir(), t.TempDir()
	files := map[string]string{"keep": "k", "mod": "old", "gone": "g", "opq/old1": "1", "opq/old2": "2", "d/x": "x", "mode": "m"}
	for _, dir := range []string{base, merged} {
		for p, c := range files {
			writeFile(t, filepath.Join(dir, p), []byte(c), 0o644)
		}
	}
	// The change, once as the merged view and once as overlay writes it.
	writeFile(t, filepath.Join(merged, "mod"), []byte("new"), 0o644)
	writeFile(t, filepath.Join(upper, "mod"), []byte("new"), 0o644)
	os.Remove(filepath.Join(merged, "gone"))
	if err := unix.Mknod(filepath.Join(upper, "gone"), unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(merged, "opq"))
	writeFile(t, filepath.Join(merged, "opq/new"), []byte("n"), 0o644)
	writeFile(t, filepath.Join(upper, "opq/new"), []byte("n"), 0o644)
	if err := unix.Setxattr(filepath.Join(upper, "opq"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatalf("trusted xattrs unavailable as root: %v", err)
	}
	os.Chmod(filepath.Join(merged, "mode"), 0o600)
	writeFile(t, filepath.Join(upper, "mode"), []byte("m"), 0o600)
	writeFile(t, filepath.Join(merged, "d/new"), []byte("y"), 0o644)
	writeFile(t, filepath.Join(upper, "d/new"), []byte("y"), 0o644)
	os.Mkdir(filepath.Join(upper, ".esf"), 0o755) // an executor's mountpoint
	// Same times and modes on every directory, so only content differs.
	for _, dir := range []string{base, merged, upper} {
		filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err == nil {
				if info.IsDir() {
					os.Chmod(p, 0o755)
				}
				ts := []unix.Timespec{{Sec: 1}, {Sec: 1}}
				unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
			}
			return nil
		})
	}
	b, err := Dir(ctx, st, base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := Dir(ctx, st, merged, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Upper(ctx, st, b.Root, upper, Options{Exclude: []string{"/.esf"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Root != want.Root {
		g, w := flatten(t, st, got.Root), flatten(t, st, want.Root)
		t.Fatalf("sealed upper differs from the merged tree:\n got %v\nwant %v", keys(g), keys(w))
	}
}
