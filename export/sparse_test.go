package export

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
)

// checkSeek compares lseek(SEEK_DATA) and lseek(SEEK_HOLE) on the file p
// with what e's holes say, at every edge of a hole.
func checkSeek(t *testing.T, p string, e cas.Entry) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	offs := []int64{0}
	for _, h := range e.Holes {
		offs = append(offs, h.Off, h.End()-1, h.End())
	}
	for _, off := range offs {
		for _, w := range []struct {
			whence int
			seek   func([]cas.Hole, int64, int64) (int64, bool)
		}{{unix.SEEK_DATA, cas.SeekData}, {unix.SEEK_HOLE, cas.SeekHole}} {
			want, ok := w.seek(e.Holes, e.Size, off)
			got, err := unix.Seek(int(f.Fd()), off, w.whence)
			if ok != (err == nil) || (ok && got != want) {
				t.Errorf("%s: lseek(%d, %d) = %d, %v; the tree says %d, %v", p, off, w.whence, got, err, want, ok)
			}
		}
	}
}

// A directory export writes a sparse file's data and leaves its holes
// unwritten: the file is as sparse as the tree says, and reads the same.
func TestToDirKeepsHoles(t *testing.T) {
	s := mem.New()
	const size = 3<<20 + 1
	content := make([]byte, size)
	copy(content[1<<20:], "data at 1 MiB")
	content[size-1] = 'x'
	id, _ := putBlob(t, s, string(content))
	tail, _ := putBlob(t, s, string(make([]byte, 2<<20)))
	entries := map[string]cas.Entry{
		"sparse": {Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o640}, Size: size, ID: id,
			Holes: []cas.Hole{{Off: 0, Len: 1 << 20}, {Off: 1<<20 + 4096, Len: 2<<20 - 4096}}},
		"all-hole": {Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 2 << 20, ID: tail,
			Holes: []cas.Hole{{Off: 0, Len: 2 << 20}}},
		"dense": {Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: size, ID: id},
	}
	b := cas.NewBuilder(s, cas.ZeroID)
	for p, e := range entries {
		if err := b.Put(context.Background(), p, e, ""); err != nil {
			t.Fatal(err)
		}
	}
	root, err := b.Write(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "out")
	if _, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true}); err != nil {
		t.Fatal(err)
	}
	for name, e := range entries {
		p := filepath.Join(dest, name)
		st := lstat(t, p)
		if st.Size != e.Size || st.Mode&0o7777 != e.Mode {
			t.Errorf("%s: size %d mode %o", name, st.Size, st.Mode&0o7777)
		}
		checkSeek(t, p, e)
		if want := cas.DataBlocks(e.Holes, e.Size, 4096) * 8; st.Blocks != want {
			t.Errorf("%s: %d blocks, want %d", name, st.Blocks, want)
		}
	}
	got, err := os.ReadFile(filepath.Join(dest, "sparse"))
	if err != nil || !bytes.Equal(got, content) {
		t.Errorf("sparse file reads %d bytes, %v; want its content", len(got), err)
	}
}

// A tree whose holes cover data lies about its file: the export fails
// with ErrCorrupt and leaves no file under the final name.
func TestToDirHoleOverDataIsCorrupt(t *testing.T) {
	s := mem.New()
	content := make([]byte, 1<<20)
	content[700_000] = 1
	id, _ := putBlob(t, s, string(content))
	b := cas.NewBuilder(s, cas.ZeroID)
	e := cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: 1 << 20, ID: id,
		Holes: []cas.Hole{{Off: 4096, Len: 1<<20 - 4096}}}
	if err := b.Put(context.Background(), "f", e, ""); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "out")
	if _, err := ToDir(context.Background(), s, root, dest, Options{PreservePrivileged: true}); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("err = %v, want ErrCorrupt", err)
	}
	if _, err := os.Lstat(filepath.Join(dest, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the file exists under its final name (lstat err %v)", err)
	}
	if left := tempLeftovers(t, dest); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// A tar export writes a sparse file's holes as zeros: a dense regular
// member of the file's size (Go's archive/tar cannot write GNU sparse
// members). What it holds reads the same as the file; only a directory
// export keeps the holes on disk (docs/fidelity.md).
func TestToTarWritesHolesAsZeros(t *testing.T) {
	s := mem.New()
	const size = 3<<20 + 1
	content := make([]byte, size)
	copy(content[1<<20:], "data at 1 MiB")
	content[size-1] = 'x'
	id, _ := putBlob(t, s, string(content))
	e := cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o640}, Size: size, ID: id,
		Holes: []cas.Hole{{Off: 0, Len: 1 << 20}, {Off: 1<<20 + 4096, Len: 2<<20 - 4096}}}
	b := cas.NewBuilder(s, cas.ZeroID)
	if err := b.Put(context.Background(), "sparse", e, ""); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := ToTar(context.Background(), s, root, &buf, Options{}); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	found := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != "./sparse" {
			continue
		}
		found = true
		if h.Typeflag != tar.TypeReg || h.Size != size {
			t.Errorf("member %s: type %q size %d, want a regular member of %d bytes", h.Name, h.Typeflag, h.Size, size)
		}
		got, err := io.ReadAll(tr)
		if err != nil || !bytes.Equal(got, content) {
			t.Errorf("member %s holds %d bytes, %v; want the file's content, zeros in its holes", h.Name, len(got), err)
		}
	}
	if !found {
		t.Error("no member ./sparse in the archive")
	}
}
