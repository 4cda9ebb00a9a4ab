package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
)

// TestPassthrough: with a local store, file reads bypass the server (the
// kernel reads the object file), and a corrupted object is refused at open.
func TestPassthrough(t *testing.T) {
	requireFUSE(t)
	ctx := context.Background()
	st, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	content := strings.Repeat("esf", 100_000)
	info, _, err := st.Put(ctx, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	bad, _, err := st.Put(ctx, strings.NewReader("soon corrupt"))
	if err != nil {
		t.Fatal(err)
	}
	b := cas.NewBuilder(st, cas.ZeroID)
	for name, in := range map[string]cas.Info{"big": info, "bad": bad} {
		if err := b.Put(ctx, name, cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: in.Size, ID: in.ID}, ""); err != nil {
			t.Fatal(err)
		}
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	// Flip a byte of the second blob on disk.
	p := st.Path(bad.ID)
	os.Chmod(p, 0o644)
	raw, _ := os.ReadFile(p)
	raw[0] ^= 1
	if err := os.WriteFile(p, raw, 0o444); err != nil {
		t.Fatal(err)
	}

	f, mnt := mount(t, st, root)
	got, err := os.ReadFile(filepath.Join(mnt, "big"))
	if err != nil || string(got) != content {
		t.Fatalf("read big: %d bytes, %v", len(got), err)
	}
	if n := f.Counters.Reads.Load(); n != 0 {
		if kernelAtLeast(6, 9) {
			t.Errorf("kernel supports passthrough, yet %d reads were served by the server", n)
		} else {
			t.Logf("no passthrough before Linux 6.9: %d reads served by the server", n)
		}
	}
	if _, err := os.ReadFile(filepath.Join(mnt, "bad")); err == nil {
		t.Fatal("corrupted blob was served")
	}
}

func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var ma, mi int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi)
	return ma > major || (ma == major && mi >= minor)
}

// TestFlippedByteAfterFirstOpenIsEIO: a blob opened and verified once, then
// damaged on disk, fails its next open with EIO, is counted and reported to
// OnCorrupt; an unchanged, cached blob is not hashed again on every open.
func TestFlippedByteAfterFirstOpenIsEIO(t *testing.T) {
	requireFUSE(t)
	ctx := context.Background()
	st, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	content := strings.Repeat("verified ", 10_000)
	info, _, err := st.Put(ctx, strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	b := cas.NewBuilder(st, cas.ZeroID)
	if err := b.Put(ctx, "f", cas.Entry{Type: cas.TypeFile, Attr: cas.Attr{Mode: 0o644}, Size: info.Size, ID: info.ID}, ""); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	var reported []cas.ID
	f, err := New(Options{Store: st, OnCorrupt: func(id cas.ID) { reported = append(reported, id) }})
	if err != nil {
		t.Fatal(err)
	}
	dir := sharedTempDir(t)
	srv, err := Mount(dir, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	p := filepath.Join(dir, "roots", root.String(), "f")
	for range 3 {
		if got, err := os.ReadFile(p); err != nil || string(got) != content {
			t.Fatalf("read: %d bytes, %v", len(got), err)
		}
	}
	if n := f.Counters.BlobVerifies.Load(); n != 1 {
		t.Logf("an unchanged blob was hashed %d times in 3 opens (not wholly cached?)", n)
	}
	w, err := os.OpenFile(st.Path(info.ID), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("V"), 0); err != nil {
		t.Fatal(err)
	}
	w.Close()
	for range 2 {
		if got, err := os.ReadFile(p); !errors.Is(err, unix.EIO) {
			t.Fatalf("read after the damage: %d bytes, err %v; want EIO", len(got), err)
		}
	}
	if n := f.Counters.CorruptBlobs.Load(); n != 2 {
		t.Errorf("CorruptBlobs %d, want 2", n)
	}
	srv.Unmount() // OnCorrupt ran on the server's goroutines
	if len(reported) != 2 || reported[0] != info.ID {
		t.Errorf("OnCorrupt got %v, want %s twice", reported, info.ID.Short())
	}
}
