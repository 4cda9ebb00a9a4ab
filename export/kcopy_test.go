package export

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
)

// TestToDirCopiesVerifiedInKernel: with a store that hands out verified
// object files, large dense files are copied from them in the kernel and
// come out byte-identical with their attributes, as their own inodes (never
// the store's); files with holes still stream and keep their holes; a file
// that is not the entry's content (wrong size) is streamed instead.
func TestToDirCopiesVerifiedInKernel(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	s, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 5<<20+3)
	rand.Read(big)
	bigID, bigSize := putBlob(t, s, string(big))
	sparse := make([]byte, 3<<20)
	copy(sparse[2<<20:], "tail data")
	sparseID, _ := putBlob(t, s, string(sparse))
	other := append([]byte("other"), big...)
	otherID, otherSize := putBlob(t, s, string(other))
	smallID, smallSize := putBlob(t, s, "small")

	const mtime = 1_700_000_000_123_456_789
	attr := func(mode uint32) cas.Attr {
		return cas.Attr{Mode: mode, UID: 1234, GID: 5678, MtimeNs: mtime, Xattrs: xattrs("user.k", "v")}
	}
	entries := map[string]cas.Entry{
		"big":      {Type: cas.TypeFile, Attr: attr(0o4750), Size: bigSize, ID: bigID},
		"d/other":  {Type: cas.TypeFile, Attr: attr(0o444), Size: otherSize, ID: otherID},
		"small":    {Type: cas.TypeFile, Attr: attr(0o600), Size: smallSize, ID: smallID},
		"d/sparse": {Type: cas.TypeFile, Attr: attr(0o644), Size: int64(len(sparse)), ID: sparseID, Holes: []cas.Hole{{Off: 0, Len: 2 << 20}}},
	}
	b := cas.NewBuilder(s, cas.ZeroID)
	for p, e := range entries {
		if err := b.Put(ctx, p, e, ""); err != nil {
			t.Fatal(err)
		}
	}
	root, err := b.Write(ctx, s)
	if err != nil {
		t.Fatal(err)
	}

	asked := map[cas.ID]int{}
	opened := 0
	opts := Options{VerifiedFile: func(id cas.ID) *os.File {
		asked[id]++
		if id == otherID {
			// Not the entry's content: the export must not use it.
			f, err := os.Open(s.Path(smallID))
			if err != nil {
				t.Error(err)
				return nil
			}
			return f
		}
		f := s.OpenVerified(id)
		if f != nil {
			opened++
		}
		return f
	}}
	dest := filepath.Join(t.TempDir(), "out")
	st, err := ToDir(ctx, s, root, dest, opts)
	if err != nil {
		t.Fatal(err)
	}
	if asked[bigID] != 1 || asked[otherID] != 1 || opened != 1 || asked[sparseID]+asked[smallID] != 0 {
		t.Fatalf("VerifiedFile asked %v, opened %d: want big and other asked once, big opened, sparse and small never asked", asked, opened)
	}
	if st.Files != 4 || st.Bytes != bigSize+otherSize+smallSize+int64(len(sparse)) {
		t.Errorf("stats %+v", st)
	}
	want := map[string][]byte{"big": big, "d/other": other, "small": []byte("small"), "d/sparse": sparse}
	for p, e := range entries {
		full := filepath.Join(dest, p)
		got, err := os.ReadFile(full)
		if err != nil || !bytes.Equal(got, want[p]) {
			t.Errorf("%s: %d bytes (%v), want its content", p, len(got), err)
		}
		fi := lstat(t, full)
		mode := e.Mode &^ setIDBits // privileged bits dropped by default
		if fi.Mode&0o7777 != mode || fi.Uid != e.UID || fi.Gid != e.GID || fi.Mtim.Nano() != mtime {
			t.Errorf("%s: mode %o uid %d gid %d mtime %d", p, fi.Mode&0o7777, fi.Uid, fi.Gid, fi.Mtim.Nano())
		}
		if x := listXattrs(t, full); x["user.k"] != "v" {
			t.Errorf("%s: xattrs %v", p, x)
		}
		obj := lstat(t, s.Path(e.ID))
		if fi.Ino == obj.Ino {
			t.Errorf("%s is the store's object file", p)
		}
	}
	checkSeek(t, filepath.Join(dest, "d/sparse"), entries["d/sparse"])
	// The copy is the user's to write; the object stays as it was.
	if err := unix.Chmod(filepath.Join(dest, "big"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dest, "big"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(s.Path(bigID)); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("writing the export changed the store's object (%v)", err)
	}
	if tl := tempLeftovers(t, dest); len(tl) != 0 {
		t.Errorf("temporary files left: %v", tl)
	}
}
