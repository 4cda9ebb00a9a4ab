package cas

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
)

// TreeView is a tree kept in its encoded form: the directory's attributes
// decoded, its entries decoded one at a time when asked for. A directory of
// a million entries costs its encoded bytes plus four bytes an entry, not
// the two hundred and more a decoded Entry takes; readers of huge
// directories (the projection, export, diff) hold views, not Trees.
//
// ParseTree checks everything DecodeTree checks before it returns, so every
// entry a view hands out is valid. A view is read-only and safe for
// concurrent use.
type TreeView struct {
	Attr
	raw  []byte
	offs []uint32 // start of each entry in raw; one more: the end
	dirs int
}

// ParseTree validates the canonical tree bytes b and indexes their entries.
// It keeps b, which the caller must not change. Anything DecodeTree rejects,
// ParseTree rejects with ErrCorrupt.
func ParseTree(b []byte) (*TreeView, error) {
	v, err := parseTree(b)
	if err != nil {
		return nil, fmt.Errorf("decode tree: %v: %w", err, ErrCorrupt)
	}
	return v, nil
}

func parseTree(b []byte) (*TreeView, error) {
	if uint64(len(b)) >= math.MaxUint32 {
		return nil, fmt.Errorf("tree of %d bytes", len(b))
	}
	v := &TreeView{raw: b}
	d := decoder{b: b}
	n := d.header(&v.Attr)
	if d.err != nil {
		return nil, d.err
	}
	if err := validateAttr(&v.Attr); err != nil {
		return nil, fmt.Errorf("directory: %w", err)
	}
	v.offs = make([]uint32, 0, n+1)
	var prev []byte
	for i := range n {
		start := len(b) - len(d.b)
		v.offs = append(v.offs, uint32(start))
		var e Entry
		d.entry(&e)
		if d.err != nil {
			return nil, d.err
		}
		name := nameAt(b, start)
		if err := ValidName(e.Name); err != nil {
			return nil, err
		}
		if i > 0 && bytes.Compare(prev, name) >= 0 {
			return nil, fmt.Errorf("entries not sorted or not unique at %q: %w", e.Name, ErrInvalidArgument)
		}
		prev = name
		if err := validateEntry(&e); err != nil {
			return nil, fmt.Errorf("entry %q: %w", e.Name, err)
		}
		if e.Type == TypeDir {
			v.dirs++
		}
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(d.b))
	}
	v.offs = append(v.offs, uint32(len(b)))
	return v, nil
}

// nameAt returns the name of the (already validated) entry at off in b.
func nameAt(b []byte, off int) []byte {
	n, k := binary.Uvarint(b[off:])
	return b[off+k : off+k+int(n)]
}

// ReadTreeView reads the tree id through g, verifies and indexes it.
func ReadTreeView(ctx context.Context, g Getter, id ID) (*TreeView, error) {
	raw, err := ReadAll(ctx, g, id)
	if err != nil {
		return nil, fmt.Errorf("read tree %s: %w", id, err)
	}
	v, err := ParseTree(raw)
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", id, err)
	}
	return v, nil
}

// Len is the number of entries.
func (v *TreeView) Len() int { return len(v.offs) - 1 }

// Dirs is the number of entries that are directories.
func (v *TreeView) Dirs() int { return v.dirs }

// Bytes is the size of the encoded tree.
func (v *TreeView) Bytes() int { return len(v.raw) }

// Entry decodes entry i (0 <= i < Len).
func (v *TreeView) Entry(i int) Entry {
	var e Entry
	d := decoder{b: v.raw[v.offs[i]:v.offs[i+1]]}
	d.entry(&e)
	return e
}

// Name returns the name of entry i without decoding the rest.
func (v *TreeView) Name(i int) string { return string(nameAt(v.raw, int(v.offs[i]))) }

// Type returns the type of entry i without decoding the rest.
func (v *TreeView) Type(i int) Type {
	off := int(v.offs[i])
	n, k := binary.Uvarint(v.raw[off:])
	t := v.raw[off+k+int(n)]
	if t == byte(TypeFile)|typeHoles {
		return TypeFile
	}
	return Type(t)
}

// Linked reports whether the non-directory entry i belongs to a hard-link
// group, without decoding it: its encoding ends with the group's name
// length, zero when it has none, or with the group's nlink (at least two).
func (v *TreeView) Linked(i int) bool {
	return v.Type(i) != TypeDir && v.raw[v.offs[i+1]-1] != 0
}

// Search returns the index of name, or where it would be, and whether it
// is there.
func (v *TreeView) Search(name string) (int, bool) {
	i := sort.Search(v.Len(), func(i int) bool {
		return string(nameAt(v.raw, int(v.offs[i]))) >= name
	})
	return i, i < v.Len() && string(nameAt(v.raw, int(v.offs[i]))) == name
}

// Lookup decodes the entry called name.
func (v *TreeView) Lookup(name string) (Entry, bool) {
	i, ok := v.Search(name)
	if !ok {
		return Entry{}, false
	}
	return v.Entry(i), true
}

// Tree decodes every entry: a Tree as DecodeTree returns it.
func (v *TreeView) Tree() *Tree {
	t := &Tree{Attr: v.Attr}
	if n := v.Len(); n > 0 {
		t.Entries = make([]Entry, n)
		for i := range n {
			t.Entries[i] = v.Entry(i)
		}
	}
	return t
}

// TreeEncoder writes a tree entry by entry, so a directory of a million
// entries is encoded without a million decoded Entries held at once. The
// bytes are those EncodeTree writes for the same tree.
type TreeEncoder struct {
	b    []byte
	want int
	n    int
	last []byte // never written through: it may alias a Builder's record
	err  error
	// w, when set, takes the bytes as they come (spill).
	w io.Writer
}

// spillAt is how many bytes a streaming encoder holds before writing.
const spillAt = 64 << 10

// spill writes what a streaming encoder holds once it is spillAt or more.
func (enc *TreeEncoder) spill(force bool) {
	if enc.w == nil || enc.err != nil || (!force && len(enc.b) < spillAt) {
		return
	}
	if _, err := enc.w.Write(enc.b); err != nil {
		enc.err = err
	}
	enc.b = enc.b[:0]
}

// finishTo ends a streaming encoder (one whose w is set).
func (enc *TreeEncoder) finishTo() error {
	if enc.err == nil && enc.n != enc.want {
		enc.err = fmt.Errorf("%d entries announced, %d added: %w", enc.want, enc.n, ErrInvalidArgument)
	}
	enc.spill(true)
	return enc.err
}

// NewTreeEncoder starts a tree with the directory attributes a and count
// entries, which must then be added in name order.
func NewTreeEncoder(a Attr, count int) *TreeEncoder {
	enc := &TreeEncoder{want: count}
	if err := validateAttr(&a); err != nil {
		enc.err = fmt.Errorf("directory: %w", err)
		return enc
	}
	enc.b = append(enc.b, treeMagic...)
	enc.b = appendAttr(enc.b, &a)
	enc.b = appendXattrs(enc.b, a.Xattrs)
	enc.b = binary.AppendUvarint(enc.b, uint64(count))
	return enc
}

// Add appends e, which must sort after the entry added before it.
func (enc *TreeEncoder) Add(e *Entry) error {
	if enc.err != nil {
		return enc.err
	}
	if err := ValidName(e.Name); err != nil {
		enc.err = err
		return err
	}
	if enc.n > 0 && string(enc.last) >= e.Name {
		enc.err = fmt.Errorf("entries not sorted or not unique at %q: %w", e.Name, ErrInvalidArgument)
		return enc.err
	}
	if err := validateEntry(e); err != nil {
		enc.err = fmt.Errorf("entry %q: %w", e.Name, err)
		return enc.err
	}
	if enc.n == enc.want {
		enc.err = fmt.Errorf("more than the %d entries announced: %w", enc.want, ErrInvalidArgument)
		return enc.err
	}
	enc.b = appendEntry(enc.b, e)
	enc.last = []byte(e.Name)
	enc.n++
	enc.spill(false)
	return enc.err
}

// grow makes room for n more bytes at once.
func (enc *TreeEncoder) grow(n int) { enc.b = slices.Grow(enc.b, n) }

// addRecord appends the encoded entry rec called name, which the caller
// validated (a Builder's record): only the order is checked.
func (enc *TreeEncoder) addRecord(name, rec []byte) error {
	if enc.err != nil {
		return enc.err
	}
	if enc.n > 0 && bytes.Compare(enc.last, name) >= 0 {
		enc.err = fmt.Errorf("entries not sorted or not unique at %q: %w", name, ErrInvalidArgument)
		return enc.err
	}
	if enc.n == enc.want {
		enc.err = fmt.Errorf("more than the %d entries announced: %w", enc.want, ErrInvalidArgument)
		return enc.err
	}
	enc.b = append(enc.b, rec...)
	enc.last = name
	enc.n++
	enc.spill(false)
	return enc.err
}

// Finish returns the encoded tree and its id.
func (enc *TreeEncoder) Finish() ([]byte, ID, error) {
	if enc.err == nil && enc.n != enc.want {
		enc.err = fmt.Errorf("%d entries announced, %d added: %w", enc.want, enc.n, ErrInvalidArgument)
	}
	if enc.err != nil {
		return nil, ZeroID, enc.err
	}
	return enc.b, Sum(enc.b), nil
}
