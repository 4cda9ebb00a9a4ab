package export

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/internal/testenv"
)

func tarName(sp spec) string {
	switch {
	case sp.path == "":
		return "./"
	case sp.typ == cas.TypeDir && sp.linkTo == "":
		return "./" + sp.path + "/"
	}
	return "./" + sp.path
}

var tarTypes = map[cas.Type]byte{
	cas.TypeFile: tar.TypeReg, cas.TypeDir: tar.TypeDir, cas.TypeSymlink: tar.TypeSymlink,
	cas.TypeCharDev: tar.TypeChar, cas.TypeBlockDev: tar.TypeBlock, cas.TypeFIFO: tar.TypeFifo,
}

func TestToTarHeaders(t *testing.T) {
	s := mem.New()
	specs := sampleSpecs()
	root := buildSpecs(t, s, specs)
	var buf bytes.Buffer
	var progress int64
	st, err := ToTar(context.Background(), s, root, &buf, Options{PreservePrivileged: true, Progress: func(n int64) { progress += n }})
	if err != nil {
		t.Fatal(err)
	}
	if want := expectedStats(specs); !reflect.DeepEqual(st, want) {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	if progress != st.Bytes {
		t.Errorf("progress %d, stats %d", progress, st.Bytes)
	}

	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for _, raw := range sortedDFS(specs) {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("at %q: %v", raw.path, err)
		}
		sp := resolve(specs, raw)
		if h.Name != tarName(raw) {
			t.Fatalf("header %q, want %q (depth-first name order)", h.Name, tarName(raw))
		}
		wantType := tarTypes[sp.typ]
		if raw.linkTo != "" {
			wantType = tar.TypeLink
			if h.Linkname != "./"+raw.linkTo {
				t.Errorf("%q: link to %q, want ./%s", h.Name, h.Linkname, raw.linkTo)
			}
		}
		if h.Typeflag != wantType {
			t.Errorf("%q: type %c, want %c", h.Name, h.Typeflag, wantType)
		}
		if h.Mode != int64(sp.attr.Mode) || h.Uid != int(sp.attr.UID) || h.Gid != int(sp.attr.GID) {
			t.Errorf("%q: mode %o owner %d:%d, want %o %d:%d", h.Name, h.Mode, h.Uid, h.Gid, sp.attr.Mode, sp.attr.UID, sp.attr.GID)
		}
		if h.Uname != "" || h.Gname != "" {
			t.Errorf("%q: user/group names %q/%q leak the host", h.Name, h.Uname, h.Gname)
		}
		if got := h.ModTime.UnixNano(); got != sp.attr.MtimeNs {
			t.Errorf("%q: mtime %d, want %d", h.Name, got, sp.attr.MtimeNs)
		}
		if !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() {
			t.Errorf("%q: atime/ctime written", h.Name)
		}
		gotX := map[string]string{}
		for k, v := range h.PAXRecords {
			if name, ok := strings.CutPrefix(k, paxXattr); ok {
				gotX[name] = v
			}
		}
		wantX := xattrMap(sp.attr.Xattrs)
		if raw.linkTo != "" {
			wantX = map[string]string{}
		}
		if !mapsEqual(gotX, wantX) {
			t.Errorf("%q: xattrs %q, want %q", h.Name, gotX, wantX)
		}
		if raw.linkTo != "" {
			continue
		}
		switch sp.typ {
		case cas.TypeFile:
			b, err := io.ReadAll(tr)
			if err != nil || string(b) != sp.content {
				t.Errorf("%q: content differs (%d bytes, %v)", h.Name, len(b), err)
			}
		case cas.TypeSymlink:
			if h.Linkname != sp.target {
				t.Errorf("%q: target %q, want %q", h.Name, h.Linkname, sp.target)
			}
		case cas.TypeCharDev, cas.TypeBlockDev:
			if h.Devmajor != int64(sp.major) || h.Devminor != int64(sp.minor) {
				t.Errorf("%q: device %d,%d", h.Name, h.Devmajor, h.Devminor)
			}
		}
	}
	if h, err := tr.Next(); err != io.EOF {
		t.Fatalf("after the last entry: %v, %v", h, err)
	}
}

func TestToTarDeterministic(t *testing.T) {
	s := mem.New()
	root := buildSpecs(t, s, sampleSpecs())
	var a, b bytes.Buffer
	if _, err := ToTar(context.Background(), s, root, &a, Options{PreservePrivileged: true}); err != nil {
		t.Fatal(err)
	}
	// A second store built in another order holds the same root.
	s2 := mem.New()
	specs := sampleSpecs()
	if root2 := buildSpecs(t, s2, specs); root2 != root {
		t.Fatal("same specs, different root")
	}
	if _, err := ToTar(context.Background(), s2, root, &b, Options{PreservePrivileged: true}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two tars of one root differ")
	}
	var c bytes.Buffer
	if _, err := ToTar(context.Background(), s, root, &c, Options{PreservePrivileged: true, NoXattrs: true}); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(c.Bytes(), []byte(paxXattr)) {
		t.Error("NoXattrs tar holds xattr records")
	}
}

// GNU tar, the extractor people actually use, restores our tar to the same
// tree that ToDir makes.
func TestToTarExtractsWithGNUTar(t *testing.T) {
	requireRoot(t)
	testenv.Require(t, "cmd:tar")
	gnutar, err := exec.LookPath("tar")
	if err != nil {
		t.Fatal(err)
	}
	s := mem.New()
	specs := sampleSpecs()
	root := buildSpecs(t, s, specs)
	var buf bytes.Buffer
	if _, err := ToTar(context.Background(), s, root, &buf, Options{PreservePrivileged: true}); err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	cmd := exec.Command(gnutar, "--xattrs", "--xattrs-include=*", "--numeric-owner", "--same-owner",
		"-xpf", "-", "-C", dest)
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	checkDir(t, dest, specs, true)
}

func TestToTarCorruptAndCancel(t *testing.T) {
	s := mem.New()
	specs := []spec{
		{path: "a", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "first"},
		{path: "b", typ: cas.TypeFile, attr: cas.Attr{Mode: 0o644}, content: "second"},
	}
	root := buildSpecs(t, s, specs)
	b, _ := putBlob(t, s, "second")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.SetFault(func(op mem.Op, id cas.ID) error {
		if op == mem.OpGet && id == b {
			cancel()
		}
		return nil
	})
	if _, err := ToTar(ctx, s, root, io.Discard, Options{PreservePrivileged: true}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: err = %v", err)
	}
	s.SetFault(nil)

	if err := s.Corrupt(b); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	_, err := ToTar(context.Background(), s, root, &buf, Options{PreservePrivileged: true})
	if !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("corrupt: err = %v", err)
	}
	// The archive has no end-of-archive marker (two zero blocks), so a
	// strict reader (GNU tar) reports it truncated.
	if b := buf.Bytes(); len(b) >= 1024 && bytes.Count(b[len(b)-1024:], []byte{0}) == 1024 {
		t.Error("a failed tar export ends with the end-of-archive marker")
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "out.tar.zst")
	if _, err := WriteTarFile(context.Background(), s, root, path, Options{PreservePrivileged: true}); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("WriteTarFile: err = %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("failed WriteTarFile left %v", ents)
	}
}

func TestWriteTarFile(t *testing.T) {
	s := mem.New()
	root := buildSpecs(t, s, sampleSpecs())
	var want bytes.Buffer
	if _, err := ToTar(context.Background(), s, root, &want, Options{PreservePrivileged: true}); err != nil {
		t.Fatal(err)
	}
	decoders := map[string]func(io.Reader) (io.Reader, error){
		"plain": func(r io.Reader) (io.Reader, error) { return r, nil },
		"gzip":  func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) },
		"zstd": func(r io.Reader) (io.Reader, error) {
			d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
			if err != nil {
				return nil, err
			}
			return d.IOReadCloser(), nil
		},
	}
	cases := []struct{ name, codec string }{
		{"out.tar", "plain"}, {"out", "plain"}, {"out.tar.gz", "gzip"}, {"out.tgz", "gzip"},
		{"out.tar.zst", "zstd"}, {"OUT.TZST", "zstd"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, c.name)
			// An existing file is replaced whole.
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := WriteTarFile(context.Background(), s, root, path, Options{PreservePrivileged: true}); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, _ := f.Stat()
			if fi.Mode().Perm() != 0o644 {
				t.Errorf("mode %v", fi.Mode())
			}
			r, err := decoders[c.codec](f)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Bytes()) {
				t.Errorf("decompressed file differs from ToTar (%d vs %d bytes)", len(got), want.Len())
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("directory holds %v, want only the archive", ents)
			}
		})
	}
}
