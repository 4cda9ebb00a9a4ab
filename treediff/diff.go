package treediff

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/esf-dev/esf/cas"
)

// Kind classifies a Change.
type Kind uint8

// The kinds of change. A path whose content and attributes both changed is
// one Modified change with a non-zero Meta.
const (
	// Added: the path is only in the new tree (Old is nil).
	Added Kind = iota + 1
	// Deleted: the path is only in the old tree (New is nil).
	Deleted
	// Modified: same type, different content (file bytes, symlink target,
	// device numbers); Meta says which attributes changed as well.
	// Directories are never Modified: their entries are reported instead.
	Modified
	// TypeChanged: the path is of another type (file to symlink, directory
	// to file, ...). Both Old and New are set; attributes are not compared.
	TypeChanged
	// MetaChanged: same type and content, different attributes (Meta).
	MetaChanged
)

var kindNames = [...]string{"", "added", "deleted", "modified", "type_changed", "meta_changed"}

func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// MarshalText implements encoding.TextMarshaler.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Meta is a set of attributes that differ between two versions of a path.
type Meta uint8

// The attribute bits of Meta.
const (
	MetaMode   Meta = 1 << iota // permission bits, setuid/setgid/sticky
	MetaOwner                   // uid or gid
	MetaMtime                   // modification time
	MetaXattrs                  // extended attributes
	MetaLink                    // hard-link group name or link count
	MetaHoles                   // a file's holes (its sparse layout)
)

var metaNames = []string{"mode", "owner", "mtime", "xattrs", "link", "holes"}

func (m Meta) String() string {
	var parts []string
	for i, n := range metaNames {
		if m&(1<<i) != 0 {
			parts = append(parts, n)
		}
	}
	return strings.Join(parts, ",")
}

// MarshalText implements encoding.TextMarshaler.
func (m Meta) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// Change is one difference between two trees.
type Change struct {
	// Path is slash-separated from the root; "" is the root directory
	// itself (only ever MetaChanged, or Added when the old tree is ZeroID).
	Path string `json:"path"`
	Kind Kind   `json:"kind"`
	// Meta lists the attributes that differ, for Modified and MetaChanged.
	Meta Meta `json:"meta,omitempty"`
	// Old and New are the entries on each side, nil where the path is
	// absent. A directory's entry carries its tree's ID and its attributes
	// (its Attr, read from its tree), unlike a stored directory entry.
	Old *cas.Entry `json:"old,omitempty"`
	New *cas.Entry `json:"new,omitempty"`
}

// Options tune Diff.
type Options struct {
	// Expand reports every path below an added or deleted directory (also
	// one that replaces or is replaced by a non-directory), each after its
	// parent, as Added or Deleted. Without it only the directory itself is
	// reported and an added or deleted subtree costs one tree read,
	// whatever its size. Patches and Apply need Expand.
	Expand bool
}

// Diff calls fn for every difference between the trees a and b, in
// depth-first name order (a directory before its entries), with the
// default Options. See DiffWith.
func Diff(ctx context.Context, g cas.Getter, a, b cas.ID, fn func(Change) error) error {
	return DiffWith(ctx, g, a, b, Options{}, fn)
}

// DiffWith calls fn for every difference between the trees a and b, in
// depth-first name order, on the caller's goroutine. ZeroID stands for no
// tree at all (every path of the other side is Added or Deleted, the root
// included).
//
// Both trees are walked in lockstep and a subtree whose id is the same on
// both sides is skipped without being read, so the cost grows with the
// difference: a change of one file reads the two trees of each directory on
// its path. An error from fn stops the walk and is returned unwrapped. The
// entries passed to fn are fresh copies the callee may keep.
func DiffWith(ctx context.Context, g cas.Getter, a, b cas.ID, opts Options, fn func(Change) error) error {
	if a == b {
		return nil
	}
	d := &differ{ctx: ctx, g: g, opts: opts, fn: fn}
	ta, err := d.tree(a)
	if err != nil {
		return err
	}
	tb, err := d.tree(b)
	if err != nil {
		return err
	}
	switch {
	case ta == nil:
		return d.added("", dirEntry("", b, tb), tb)
	case tb == nil:
		return d.deleted("", dirEntry("", a, ta), ta)
	}
	if m := attrDiff(&ta.Attr, &tb.Attr); m != 0 {
		c := Change{Kind: MetaChanged, Meta: m, Old: dirEntry("", a, ta), New: dirEntry("", b, tb)}
		if err := fn(c); err != nil {
			return err
		}
	}
	return d.dirs("", ta, tb)
}

type differ struct {
	ctx  context.Context
	g    cas.Getter
	opts Options
	fn   func(Change) error
}

// tree reads id, or returns nil for ZeroID.
func (d *differ) tree(id cas.ID) (*cas.TreeView, error) {
	if id.IsZero() {
		return nil, nil
	}
	if err := d.ctx.Err(); err != nil {
		return nil, err
	}
	// A view: a huge directory is compared one decoded entry at a time.
	return cas.ReadTreeView(d.ctx, d.g, id)
}

// dirEntry is the enriched entry of a directory: its tree id and attributes.
func dirEntry(name string, id cas.ID, t *cas.TreeView) *cas.Entry {
	return &cas.Entry{Name: name, Type: cas.TypeDir, ID: id, Attr: cloneAttr(t.Attr)}
}

func cloneAttr(a cas.Attr) cas.Attr {
	if a.Xattrs != nil {
		xs := make([]cas.Xattr, len(a.Xattrs))
		for i, x := range a.Xattrs {
			xs[i] = cas.Xattr{Name: x.Name, Value: bytes.Clone(x.Value)}
		}
		a.Xattrs = xs
	}
	return a
}

func cloneEntry(e *cas.Entry) *cas.Entry {
	c := *e
	c.Attr = cloneAttr(e.Attr)
	c.Holes = slices.Clone(e.Holes)
	return &c
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// dirs compares the entries of two directories at path p, merging their
// sorted lists.
func (d *differ) dirs(p string, ta, tb *cas.TreeView) error {
	i, j := 0, 0
	for i < ta.Len() || j < tb.Len() {
		if err := d.ctx.Err(); err != nil {
			return err
		}
		var na, nb string
		if i < ta.Len() {
			na = ta.Name(i)
		}
		if j < tb.Len() {
			nb = tb.Name(j)
		}
		switch {
		case j == tb.Len() || (i < ta.Len() && na < nb):
			ea := ta.Entry(i)
			if err := d.deletedEntry(join(p, na), &ea); err != nil {
				return err
			}
			i++
		case i == ta.Len() || nb < na:
			eb := tb.Entry(j)
			if err := d.addedEntry(join(p, nb), &eb); err != nil {
				return err
			}
			j++
		default:
			ea, eb := ta.Entry(i), tb.Entry(j)
			if err := d.both(join(p, na), &ea, &eb); err != nil {
				return err
			}
			i, j = i+1, j+1
		}
	}
	return nil
}

func (d *differ) both(p string, ea, eb *cas.Entry) error {
	if ea.Type == cas.TypeDir && eb.Type == cas.TypeDir {
		if ea.ID == eb.ID {
			return nil
		}
		ta, err := d.tree(ea.ID)
		if err != nil {
			return err
		}
		tb, err := d.tree(eb.ID)
		if err != nil {
			return err
		}
		if m := attrDiff(&ta.Attr, &tb.Attr); m != 0 {
			c := Change{Path: p, Kind: MetaChanged, Meta: m,
				Old: dirEntry(ea.Name, ea.ID, ta), New: dirEntry(eb.Name, eb.ID, tb)}
			if err := d.fn(c); err != nil {
				return err
			}
		}
		return d.dirs(p, ta, tb)
	}
	if ea.Type != eb.Type {
		return d.typeChanged(p, ea, eb)
	}
	if EntriesEqual(ea, eb) {
		return nil
	}
	kind := MetaChanged
	if !sameContent(ea, eb) {
		kind = Modified
	}
	return d.fn(Change{Path: p, Kind: kind, Meta: EntryMetaDiff(ea, eb), Old: cloneEntry(ea), New: cloneEntry(eb)})
}

func (d *differ) typeChanged(p string, ea, eb *cas.Entry) error {
	var ta, tb *cas.TreeView
	old, nw := cloneEntry(ea), cloneEntry(eb)
	var err error
	if ea.Type == cas.TypeDir {
		if ta, err = d.tree(ea.ID); err != nil {
			return err
		}
		old = dirEntry(ea.Name, ea.ID, ta)
	}
	if eb.Type == cas.TypeDir {
		if tb, err = d.tree(eb.ID); err != nil {
			return err
		}
		nw = dirEntry(eb.Name, eb.ID, tb)
	}
	if err := d.fn(Change{Path: p, Kind: TypeChanged, Old: old, New: nw}); err != nil {
		return err
	}
	if !d.opts.Expand {
		return nil
	}
	if ta != nil {
		return d.below(p, ta, Deleted)
	}
	if tb != nil {
		return d.below(p, tb, Added)
	}
	return nil
}

func (d *differ) addedEntry(p string, e *cas.Entry) error {
	if e.Type != cas.TypeDir {
		return d.fn(Change{Path: p, Kind: Added, New: cloneEntry(e)})
	}
	t, err := d.tree(e.ID)
	if err != nil {
		return err
	}
	return d.added(p, dirEntry(e.Name, e.ID, t), t)
}

func (d *differ) deletedEntry(p string, e *cas.Entry) error {
	if e.Type != cas.TypeDir {
		return d.fn(Change{Path: p, Kind: Deleted, Old: cloneEntry(e)})
	}
	t, err := d.tree(e.ID)
	if err != nil {
		return err
	}
	return d.deleted(p, dirEntry(e.Name, e.ID, t), t)
}

func (d *differ) added(p string, e *cas.Entry, t *cas.TreeView) error {
	if err := d.fn(Change{Path: p, Kind: Added, New: e}); err != nil {
		return err
	}
	if !d.opts.Expand {
		return nil
	}
	return d.below(p, t, Added)
}

func (d *differ) deleted(p string, e *cas.Entry, t *cas.TreeView) error {
	if err := d.fn(Change{Path: p, Kind: Deleted, Old: e}); err != nil {
		return err
	}
	if !d.opts.Expand {
		return nil
	}
	return d.below(p, t, Deleted)
}

// below reports every entry of t, recursively, as kind.
func (d *differ) below(p string, t *cas.TreeView, kind Kind) error {
	for i := range t.Len() {
		ent := t.Entry(i)
		e := &ent
		var err error
		if kind == Added {
			err = d.addedEntry(join(p, e.Name), e)
		} else {
			err = d.deletedEntry(join(p, e.Name), e)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// EntriesEqual reports whether two stored entries describe the same thing:
// every field, attributes and link group included (a directory entry holds
// only its name, type and tree id, so two directories are equal when their
// trees are).
func EntriesEqual(a, b *cas.Entry) bool {
	return a.Name == b.Name && a.Type == b.Type && a.ID == b.ID && a.Size == b.Size &&
		a.Target == b.Target && a.Major == b.Major && a.Minor == b.Minor &&
		a.LinkGroup == b.LinkGroup && a.Nlink == b.Nlink && slices.Equal(a.Holes, b.Holes) &&
		attrDiff(&a.Attr, &b.Attr) == 0
}

// sameContent compares what a non-directory holds, for entries of one type.
func sameContent(a, b *cas.Entry) bool {
	return a.ID == b.ID && a.Size == b.Size && a.Target == b.Target && a.Major == b.Major && a.Minor == b.Minor
}

// EntryMetaDiff lists the attributes that differ between two entries, the
// hard-link group included.
func EntryMetaDiff(a, b *cas.Entry) Meta {
	m := attrDiff(&a.Attr, &b.Attr)
	if a.LinkGroup != b.LinkGroup || a.Nlink != b.Nlink {
		m |= MetaLink
	}
	if !slices.Equal(a.Holes, b.Holes) {
		m |= MetaHoles
	}
	return m
}

func attrDiff(a, b *cas.Attr) Meta {
	var m Meta
	if a.Mode != b.Mode {
		m |= MetaMode
	}
	if a.UID != b.UID || a.GID != b.GID {
		m |= MetaOwner
	}
	if a.MtimeNs != b.MtimeNs {
		m |= MetaMtime
	}
	if !xattrsEqual(a.Xattrs, b.Xattrs) {
		m |= MetaXattrs
	}
	return m
}

func xattrsEqual(a, b []cas.Xattr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}
