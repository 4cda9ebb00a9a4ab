package local_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
)

// rewrite replaces the content of object id's file in place, as a disk or
// a stray writer could.
func rewrite(t *testing.T, s *local.Store, id cas.ID, b []byte) {
	t.Helper()
	p := s.Path(id)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestReadSmall: ReadSmall returns exactly the object's bytes, and an object
// whose file was altered (same size, shorter, longer), a missing one or a
// too small buffer is an error of its stable kind, never bytes.
func TestReadSmall(t *testing.T) {
	ctx := context.Background()
	s, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	content := []byte("hello, small object")
	info, _, err := s.Put(ctx, bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	got, err := s.ReadSmall(info.ID, info.Size, buf)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("ReadSmall = %q, %v", got, err)
	}
	empty, _, err := s.Put(ctx, bytes.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.ReadSmall(empty.ID, 0, buf); err != nil || len(got) != 0 {
		t.Fatalf("empty: %q, %v", got, err)
	}
	if _, err := s.ReadSmall(info.ID, info.Size, buf[:info.Size]); !errors.Is(err, cas.ErrInvalidArgument) {
		t.Fatalf("buffer without the extra byte: %v", err)
	}
	if _, err := s.ReadSmall(cas.Sum([]byte("absent")), 6, buf); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("absent: %v", err)
	}
	// The size the caller states must be the object's.
	if _, err := s.ReadSmall(info.ID, info.Size-1, buf); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("stated size too small: %v", err)
	}
	if _, err := s.ReadSmall(info.ID, info.Size+1, buf); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("stated size too large: %v", err)
	}

	flipped := bytes.Clone(content)
	flipped[3] ^= 1
	for name, b := range map[string][]byte{
		"same size":  flipped,
		"shorter":    content[:len(content)-1],
		"longer":     append(bytes.Clone(content), '!'),
		"empty file": nil,
	} {
		rewrite(t, s, info.ID, b)
		got, err := s.ReadSmall(info.ID, info.Size, buf)
		if !errors.Is(err, cas.ErrCorrupt) || got != nil {
			t.Errorf("%s: ReadSmall = %q, %v; want ErrCorrupt", name, got, err)
		}
	}
}
