package export

import (
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
	"github.com/esf-dev/esf/cas/mem"
)

// localTree builds root/{a, d/b, d/c} in a cas/local store, b with content
// b, and returns the store, the root and b's id.
func localTree(t *testing.T, b string) (*local.Store, cas.ID, cas.ID) {
	t.Helper()
	ctx := context.Background()
	s, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	bld := cas.NewBuilder(s, cas.ZeroID)
	var bid cas.ID
	for _, f := range []struct{ path, content string }{{"a", "good"}, {"d/b", b}, {"d/c", "after"}} {
		info, _, err := s.Put(ctx, strings.NewReader(f.content))
		if err != nil {
			t.Fatal(err)
		}
		if f.path == "d/b" {
			bid = info.ID
		}
		e := cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644, MtimeNs: ts0}, ID: info.ID, Size: info.Size}
		if err := bld.Put(ctx, f.path, e, ""); err != nil {
			t.Fatal(err)
		}
	}
	root, err := bld.Write(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	return s, root, bid
}

// TestReadSmallExports: with the store's ReadSmall (as esfd exports), a
// good tree exports the same as through Get, and a blob whose file was
// altered still fails ToTar and ToDir with ErrCorrupt, none of its bytes
// written.
func TestReadSmallExports(t *testing.T) {
	for _, size := range []int{5, 4096, 3<<20 + 1} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			content := pattern(size)
			s, root, bid := localTree(t, content)
			fast := Options{ReadSmall: s.ReadSmall, VerifiedFile: s.OpenVerified}
			var want, got bytes.Buffer
			if _, err := ToTar(context.Background(), s, root, &want, Options{}); err != nil {
				t.Fatal(err)
			}
			if _, err := ToTar(context.Background(), s, root, &got, fast); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want.Bytes()) {
				t.Fatal("tar through ReadSmall differs from tar through Get")
			}
			dest := filepath.Join(t.TempDir(), "good")
			if _, err := ToDir(context.Background(), s, root, dest, fast); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(dest, "d", "b")); err != nil || string(b) != content {
				t.Fatalf("d/b: %d bytes, %v", len(b), err)
			}

			bad := []byte(content)
			bad[len(bad)/2] ^= 0x55
			p := s.Path(bid)
			if err := os.Chmod(p, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if _, err := ToTar(context.Background(), s, root, &out, fast); !errors.Is(err, cas.ErrCorrupt) {
				t.Fatalf("tar: err = %v, want ErrCorrupt", err)
			}
			if bytes.Contains(out.Bytes(), bad) {
				t.Error("the tar holds the corrupt blob whole")
			}
			if bytes.Contains(out.Bytes(), []byte("after")) {
				t.Error("the tar went on after the corrupt blob")
			}
			dest = filepath.Join(t.TempDir(), "bad")
			if _, err := ToDir(context.Background(), s, root, dest, fast); !errors.Is(err, cas.ErrCorrupt) {
				t.Fatalf("dir: err = %v, want ErrCorrupt", err)
			}
			if _, err := os.Lstat(filepath.Join(dest, "d", "b")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("corrupt file exists under its final name (lstat err %v)", err)
			}
		})
	}
}

// TestReadSmallFallsBack: a blob ReadSmall does not have is read through
// the Getter; its other errors fail the export as they are.
func TestReadSmallFallsBack(t *testing.T) {
	s := mem.New()
	specs := sampleSpecs()
	root := buildSpecs(t, s, specs)
	var want bytes.Buffer
	if _, err := ToTar(context.Background(), s, root, &want, Options{PreservePrivileged: true}); err != nil {
		t.Fatal(err)
	}
	var calls int
	absent := func(id cas.ID, size int64, buf []byte) ([]byte, error) {
		calls++
		return nil, fmt.Errorf("read %s: %w", id, cas.ErrNotFound)
	}
	var got bytes.Buffer
	if _, err := ToTar(context.Background(), s, root, &got, Options{PreservePrivileged: true, ReadSmall: absent}); err != nil {
		t.Fatal(err)
	}
	if calls == 0 || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("fallback: %d calls, same bytes %v", calls, bytes.Equal(got.Bytes(), want.Bytes()))
	}
	failing := func(id cas.ID, size int64, buf []byte) ([]byte, error) {
		return nil, fmt.Errorf("read %s: %w", id, io.ErrUnexpectedEOF)
	}
	if _, err := ToTar(context.Background(), s, root, io.Discard, Options{PreservePrivileged: true, ReadSmall: failing}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("failing ReadSmall: err = %v", err)
	}
	if _, err := ToDir(context.Background(), s, root, filepath.Join(t.TempDir(), "out"), Options{PreservePrivileged: true, ReadSmall: failing}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("failing ReadSmall, dir: err = %v", err)
	}
}
