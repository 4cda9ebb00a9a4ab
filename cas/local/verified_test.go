package local_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
)

func readAll(t *testing.T, f *os.File) []byte {
	t.Helper()
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOpenVerified: a large object is handed out raw only while the file
// the store hashed is unchanged; a write to it, a new store or a small
// object mean nil, and a Get read to its verified end records it again.
func TestOpenVerified(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := local.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 3*local.VerifyMin+17)
	rand.Read(big)
	info, _, err := s.Put(ctx, bytes.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	f := s.OpenVerified(info.ID)
	if f == nil {
		t.Fatal("a large object just put is not verified")
	}
	if got := readAll(t, f); !bytes.Equal(got, big) {
		t.Fatal("OpenVerified's file does not hold the object")
	}

	small, _, err := s.Put(ctx, bytes.NewReader(big[:local.VerifyMin-1]))
	if err != nil {
		t.Fatal(err)
	}
	if f := s.OpenVerified(small.ID); f != nil {
		f.Close()
		t.Fatal("a small object is handed out raw")
	}

	// A batch's large object, once linked in.
	other := append([]byte("batch"), big...)
	b := s.NewBatch()
	binfo, _, err := b.Put(ctx, bytes.NewReader(other))
	if err != nil {
		t.Fatal(err)
	}
	if f := s.OpenVerified(binfo.ID); f != nil {
		f.Close()
		t.Fatal("an object not yet committed is handed out")
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if f := s.OpenVerified(binfo.ID); f == nil {
		t.Fatal("a large object a batch committed is not verified")
	} else if got := readAll(t, f); !bytes.Equal(got, other) {
		t.Fatal("OpenVerified's file does not hold the batch's object")
	}

	// Another store on the same directory has verified nothing; a Get to
	// the end verifies.
	s2, err := local.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f := s2.OpenVerified(info.ID); f != nil {
		f.Close()
		t.Fatal("a fresh store hands out an object it never hashed")
	}
	rc, err := s2.Get(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if f := s2.OpenVerified(info.ID); f == nil {
		t.Fatal("an object read to its verified end is not verified")
	} else {
		f.Close()
	}

	// A write in place (same inode, same size) takes it out of the set,
	// and the Get that finds the damage does not put it back.
	harness{s2}.Corrupt(t, info.ID)
	if f := s2.OpenVerified(info.ID); f != nil {
		f.Close()
		t.Fatal("an object written since its verification is handed out raw")
	}
	rc, err = s2.Get(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, rc); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("Get of a corrupt object: %v, want ErrCorrupt", err)
	}
	rc.Close()
	if f := s2.OpenVerified(info.ID); f != nil {
		f.Close()
		t.Fatal("a corrupt object is handed out raw")
	}
}
