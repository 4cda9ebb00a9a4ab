package atomicfile_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/internal/atomicfile"
)

// entries lists dir's names, to show no temporary file is left.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteFileReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.WriteFile(p, []byte("new content"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "new content" {
		t.Fatalf("read %q, %v", b, err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640 (not reduced by the umask)", fi.Mode().Perm())
	}
	if got := entries(t, dir); len(got) != 1 || got[0] != "f" {
		t.Errorf("directory holds %v, want only f", got)
	}
}

func TestAbortLeavesTargetAlone(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := atomicfile.Create(p, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("half")); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, dir); len(got) != 2 {
		t.Fatalf("while writing, directory holds %v: want f and the temporary file", got)
	}
	f.Abort()
	f.Abort() // twice is harmless
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("after Abort f holds %q, want the old content", b)
	}
	if got := entries(t, dir); len(got) != 1 {
		t.Errorf("after Abort directory holds %v, want only f", got)
	}
	if err := f.Commit(); err == nil {
		t.Error("Commit after Abort succeeded")
	}
}

func TestCommitThenAbortKeepsContent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	f, err := atomicfile.Create(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Abort()
	f.Write([]byte("x"))
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	f.Abort()
	if b, err := os.ReadFile(p); err != nil || string(b) != "x" {
		t.Fatalf("read %q, %v", b, err)
	}
}

func TestRenameFailureRemovesTemporary(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A non-empty directory cannot be renamed over.
	if err := atomicfile.WriteFile(p, []byte("y"), 0o644); err == nil {
		t.Fatal("replacing a non-empty directory succeeded")
	}
	if got := entries(t, dir); len(got) != 1 || got[0] != "d" {
		t.Errorf("directory holds %v, want only d", got)
	}
}

func TestCreateInMissingDirectory(t *testing.T) {
	_, err := atomicfile.Create(filepath.Join(t.TempDir(), "no", "f"), 0o644)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err %v, want not exist", err)
	}
}
