package fabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/ingest"
)

// chain makes the directories names below dirfd, one inside the other, and
// returns a descriptor of the deepest: every call is relative to a
// descriptor, so the chain may be deeper than PATH_MAX.
func chain(t *testing.T, dirfd int, names []string) int {
	t.Helper()
	fd, err := unix.Dup(dirfd)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := unix.Mkdirat(fd, n, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatalf("mkdir %q: %v", n, err)
		}
		next, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatalf("open %q: %v", n, err)
		}
		fd = next
	}
	return fd
}

func writeAt(t *testing.T, dirfd int, name, content string) {
	t.Helper()
	fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatalf("create %q: %v", name, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(content)); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, dirfd int, name string) string {
	t.Helper()
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Errorf("open %q: %v", name, err)
		return ""
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Error(err)
	}
	return string(b)
}

// TestBoundary_LongPathSeals: what a sandbox may legally make seals: a
// 6000-byte path (past the host's PATH_MAX once under the upper dir), a
// 1000-level tree, and names with newlines, control bytes, invalid UTF-8,
// shell and overlay option characters and the full 255 bytes. The sealed
// tree holds them all, and an export writes them back.
func TestBoundary_LongPathSeals(t *testing.T) {
	f, _ := openCounted(t)
	ctx := context.Background()
	g := newGroup(t, f, map[string]string{"base.txt": "base"})
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	root, err := unix.Open(a.Root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}

	var long []string // 30 names of 200 bytes: 6029 bytes of path
	for i := range 30 {
		long = append(long, fmt.Sprintf("%03d", i)+strings.Repeat("L", 197))
	}
	deep := make([]string, 1000) // 1000 levels
	for i := range deep {
		deep[i] = "d"
	}
	odd := []string{"new\nline", " spaces ", "\x01ctl\x7f", "é ü 日本", "\xff\xfe not utf-8", "-dash", ".hidden",
		"a:b\\c,d=e", "*?[x]", "'\"`$(x)", strings.Repeat("n", 255)}

	for _, c := range [][]string{long, deep} {
		fd := chain(t, root, c)
		writeAt(t, fd, "leaf.txt", "at the bottom")
		unix.Close(fd)
	}
	oddDir := chain(t, root, []string{"odd"})
	for _, n := range odd {
		writeAt(t, oddDir, n, "odd "+n)
	}
	unix.Close(oddDir)
	unix.Close(root) // an open root would keep the seal from unmounting it

	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatalf("seal of legal paths: %v", err)
	}
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := f.ExportDir(ctx, res.Node.NodeID, out); err != nil {
		t.Fatal(err)
	}
	outfd, err := unix.Open(out, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(outfd)
	for name, c := range map[string][]string{"6000-byte path": long, "1000 levels": deep} {
		fd := chain(t, outfd, c)
		if got := readAt(t, fd, "leaf.txt"); got != "at the bottom" {
			t.Errorf("%s: leaf %q", name, got)
		}
		unix.Close(fd)
	}
	oddOut := chain(t, outfd, []string{"odd"})
	defer unix.Close(oddOut)
	for _, n := range odd {
		if got := readAt(t, oddOut, n); got != "odd "+n {
			t.Errorf("%q: %q", n, got)
		}
	}
	if got := readAt(t, outfd, "base.txt"); got != "base" {
		t.Errorf("base.txt: %q", got)
	}
}

// A seal that fails names the sandbox's path, never the host's.
func TestSealErrorShowsNoHostPath(t *testing.T) {
	upper := filepath.Join(t.TempDir(), "secret-host-dir", "upper")
	_, err := ingest.Upper(context.Background(), nil, [32]byte{}, upper, ingest.Options{})
	if err == nil || strings.Contains(err.Error(), "secret-host-dir") {
		t.Fatalf("seal of a missing upper dir: %v", err)
	}
}
