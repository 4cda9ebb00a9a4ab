package export

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
)

// hugeTree builds, in a cas/local store (whose readers tell their size),
// a root with a file and a directory big of n files and a subdirectory,
// and returns the store, the root and big's tree.
func hugeTree(t *testing.T, n int) (*local.Store, cas.ID, cas.ID) {
	t.Helper()
	ctx := context.Background()
	s, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b := cas.NewBuilder(s, cas.ZeroID)
	put := func(p, content string) {
		info, _, err := s.Put(ctx, strings.NewReader(content))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Put(ctx, p, cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, ID: info.ID, Size: info.Size}, ""); err != nil {
			t.Fatal(err)
		}
	}
	put("top", "top")
	put("big/sub/x", "x")
	for i := range n {
		put(fmt.Sprintf("big/entry-%07d", i), fmt.Sprint(i%3))
	}
	root, err := b.Write(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cas.ReadTreeView(ctx, s, root)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := v.Lookup("big")
	if !ok {
		t.Fatal("no big")
	}
	return s, root, e.ID
}

// TestExportScansAHugeDirectory: a directory whose tree is over viewMax
// exports whole to a directory and to a tar, through a scan.
func TestExportScansAHugeDirectory(t *testing.T) {
	const n = 20000
	s, root, big := hugeTree(t, n)
	if v, err := cas.ReadTreeViewUpTo(context.Background(), s, big, viewMax); err != nil || v != nil {
		t.Fatalf("big's tree is held as a view (err %v): make it larger than viewMax", err)
	}
	dest := filepath.Join(t.TempDir(), "out")
	st, err := ToDir(context.Background(), s, root, dest, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := countNames(filepath.Join(dest, "big")); err != nil || got != n+1 {
		t.Fatalf("big holds %d names (%v), want %d", got, err, n+1)
	}
	if st.Files != n+2 {
		t.Errorf("files = %d, want %d", st.Files, n+2)
	}
	for p, want := range map[string]string{"top": "top", "big/sub/x": "x", "big/entry-0000004": "1", fmt.Sprintf("big/entry-%07d", n-1): fmt.Sprint((n - 1) % 3)} {
		if b, err := os.ReadFile(filepath.Join(dest, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", p, b, err, want)
		}
	}
	var buf bytes.Buffer
	if _, err := ToTar(context.Background(), s, root, &buf, Options{}); err != nil {
		t.Fatal(err)
	}
	members := 0
	tr := tar.NewReader(&buf)
	for {
		_, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		members++
	}
	// ./, top, big/, big/sub/, big/sub/x and the n entries.
	if members != n+5 {
		t.Errorf("tar holds %d members, want %d", members, n+5)
	}
}

// corruptGetter serves one tree's bytes with a byte flipped, from a file
// (so that its size is told), as the store's Get would: the hash check at
// the end fails.
type corruptGetter struct {
	cas.Getter
	id   cas.ID
	path string
}

func (g *corruptGetter) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	if id != g.id {
		return g.Getter.Get(ctx, id)
	}
	f, err := os.Open(g.path)
	if err != nil {
		return nil, err
	}
	return cas.VerifyingReader(id, f), nil
}

// TestExportHugeCorruptTreeCreatesNothing: a corrupt tree over viewMax is
// found before any of it is written, as a view's would be: the directory
// is not created (and, for the root, neither is the destination).
func TestExportHugeCorruptTreeCreatesNothing(t *testing.T) {
	s, root, big := hugeTree(t, 20000)
	raw, err := cas.ReadAll(context.Background(), s, big)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-10] ^= 1 // late, past what a first window holds
	p := filepath.Join(t.TempDir(), "corrupt")
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	g := &corruptGetter{Getter: s, id: big, path: p}
	dest := filepath.Join(t.TempDir(), "out")
	if _, err := ToDir(context.Background(), g, root, dest, Options{}); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("export of a corrupt subtree: %v, want corrupt", err)
	}
	if _, err := os.Lstat(filepath.Join(dest, "big")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the corrupt tree's directory was created (lstat: %v)", err)
	}
	dest2 := filepath.Join(t.TempDir(), "out")
	if _, err := ToDir(context.Background(), g, big, dest2, Options{}); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("export of a corrupt root: %v, want corrupt", err)
	}
	if _, err := os.Lstat(dest2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a corrupt root created dest (lstat: %v)", err)
	}
}

func countNames(dir string) (int, error) {
	f, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	return len(names), err
}
