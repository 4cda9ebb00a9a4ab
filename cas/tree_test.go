package cas

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
)

// mapStore is the smallest Getter+Putter the tree tests need; the real
// stores are tested by cas/castest.
type mapStore struct {
	mu sync.Mutex
	m  map[ID][]byte
}

func (s *mapStore) Get(_ context.Context, id ID) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[id]
	if !ok {
		return nil, ErrNotFound
	}
	return VerifyingReader(id, io.NopCloser(bytes.NewReader(b))), nil
}

func (s *mapStore) Put(_ context.Context, r io.Reader) (Info, bool, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return Info{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[ID][]byte{}
	}
	id := Sum(b)
	_, had := s.m[id]
	s.m[id] = b
	return Info{ID: id, Size: int64(len(b))}, !had, nil
}

func sampleTree() *Tree {
	return &Tree{
		Attr: Attr{Mode: 0o755, MtimeNs: 1},
		Entries: []Entry{
			{Name: "a", Type: TypeFile, Attr: Attr{Mode: 0o4755, UID: 1000, GID: 1000, MtimeNs: -5,
				Xattrs: []Xattr{{Name: "user.a", Value: []byte("1")}, {Name: "user.b"}}},
				Size: 3, ID: Sum([]byte("abc")), LinkGroup: "a", Nlink: 2},
			{Name: "d", Type: TypeDir, ID: Sum([]byte("x"))},
			{Name: "dev", Type: TypeCharDev, Attr: Attr{Mode: 0o600}, Major: 1, Minor: 3},
			{Name: "f", Type: TypeFIFO, Attr: Attr{Mode: 0o644}},
			{Name: "l", Type: TypeSymlink, Attr: Attr{Mode: 0o777}, Target: "../etc", Size: 6},
		},
	}
}

func TestTreeRoundTrip(t *testing.T) {
	tr := sampleTree()
	raw, err := EncodeTree(tr)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeTree(raw)
	if err != nil {
		t.Fatal(err)
	}
	again, err := EncodeTree(got)
	if err != nil || !bytes.Equal(raw, again) {
		t.Fatalf("re-encode differs (err %v)", err)
	}
	if e, ok := got.Lookup("l"); !ok || e.Target != "../etc" {
		t.Fatalf("lookup l = %+v, %v", e, ok)
	}
}

func TestTreeRejectsNonCanonical(t *testing.T) {
	bad := []func(*Tree){
		func(t *Tree) { t.Entries[0], t.Entries[1] = t.Entries[1], t.Entries[0] },
		func(t *Tree) { t.Entries[0].Name = ".." },
		func(t *Tree) { t.Entries[0].Name = "x/y" },
		func(t *Tree) { t.Entries[0].Mode = 0o10000 },
		func(t *Tree) { t.Entries[1].Attr.Mode = 0o755 },
		func(t *Tree) { t.Entries[0].Nlink = 1 },
		func(t *Tree) { t.Entries[0].Xattrs[0].Name = "user.z" },
		func(t *Tree) { t.Entries[4].Target = "" },
	}
	for i, mutate := range bad {
		tr := sampleTree()
		mutate(tr)
		if _, err := EncodeTree(tr); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("case %d: encode err = %v, want invalid argument", i, err)
		}
		// The same tree forced onto the wire must not decode either (a
		// directory entry's attributes are never on the wire: case 4).
		if i == 4 {
			continue
		}
		if _, err := DecodeTree(appendTree(nil, tr)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("case %d: decode err = %v, want corrupt", i, err)
		}
	}
	raw, _ := EncodeTree(sampleTree())
	for _, b := range [][]byte{raw[:len(raw)-1], append(bytes.Clone(raw), 0), []byte("ESFT\x02")} {
		if _, err := DecodeTree(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("decode of mangled tree: err = %v, want corrupt", err)
		}
	}
}

func FuzzDecodeTree(f *testing.F) {
	raw, _ := EncodeTree(sampleTree())
	f.Add(raw)
	sparse, _ := EncodeTree(sparseTree())
	f.Add(sparse)
	empty, _ := EncodeTree(&Tree{})
	f.Add(empty)
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := DecodeTree(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decode error is not ErrCorrupt: %v", err)
			}
			return
		}
		again, err := EncodeTree(tr)
		if err != nil {
			t.Fatalf("decoded tree does not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("decode accepted a non-canonical encoding")
		}
	})
}

func TestBuilderIncremental(t *testing.T) {
	ctx := context.Background()
	st := &mapStore{}
	b := NewBuilder(st, ZeroID)
	file := func(content string) Entry {
		return Entry{Type: TypeFile, Attr: Attr{Mode: 0o644}, Size: int64(len(content)), ID: Sum([]byte(content))}
	}
	for _, p := range []string{"a/x", "a/y", "b/c/d", "top"} {
		if err := b.Put(ctx, p, file(p), ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Link(ctx, "b/hard", "top"); err != nil {
		t.Fatal(err)
	}
	root, err := b.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := ReadTree(ctx, st, root)
	if err != nil {
		t.Fatal(err)
	}
	top, _ := rt.Lookup("top")
	if top.LinkGroup != "b/hard" || top.Nlink != 2 {
		t.Fatalf("link group of top = %q/%d, want b/hard/2 (first in depth-first order)", top.LinkGroup, top.Nlink)
	}

	// A second builder on that base touching one path re-encodes only the
	// trees along it; the same tree built from scratch has the same id.
	before := len(st.m)
	b2 := NewBuilder(st, root)
	if err := b2.Put(ctx, "a/x", file("changed"), ""); err != nil {
		t.Fatal(err)
	}
	root2, err := b2.Write(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if added := len(st.m) - before; added != 2 {
		t.Fatalf("changing a/x wrote %d trees, want 2 (a and root)", added)
	}
	if err := b.Put(ctx, "a/x", file("changed"), ""); err != nil {
		t.Fatal(err)
	}
	if root3, _ := b.Write(ctx, st); root3 != root2 {
		t.Fatalf("incremental root %s != full rebuild %s", root2.Short(), root3.Short())
	}
	// Delete, and delete of a missing path.
	if err := b2.Delete(ctx, "b/c"); err != nil {
		t.Fatal(err)
	}
	if err := b2.Delete(ctx, "no/such"); err != nil {
		t.Fatal(err)
	}
	if err := b2.Put(ctx, "top/x", file("x"), ""); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("put under a file: err = %v", err)
	}
}
