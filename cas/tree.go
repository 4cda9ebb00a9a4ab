package cas

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
)

// Type is the kind of a tree entry.
type Type uint8

// Entry types. Sockets are not representable: importers skip them.
const (
	TypeFile Type = iota + 1
	TypeDir
	TypeSymlink
	TypeCharDev
	TypeBlockDev
	TypeFIFO
)

var typeNames = [...]string{"", "file", "dir", "symlink", "chardev", "blockdev", "fifo"}

func (t Type) String() string {
	if int(t) < len(typeNames) && t != 0 {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// MarshalText implements encoding.TextMarshaler.
func (t Type) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (t *Type) UnmarshalText(b []byte) error {
	for i, n := range typeNames {
		if i > 0 && n == string(b) {
			*t = Type(i)
			return nil
		}
	}
	return fmt.Errorf("entry type %q: %w", b, ErrInvalidArgument)
}

// Limits the decoder enforces (those of Linux where it has one).
const (
	MaxNameLen       = 255
	MaxTargetLen     = 4095
	MaxXattrNameLen  = 255
	MaxXattrValueLen = 64 << 10
	// ModeMask keeps permission bits with setuid, setgid and sticky.
	ModeMask = 0o7777
)

// Xattr is one extended attribute.
type Xattr struct {
	Name  string `json:"name"`
	Value []byte `json:"value"`
}

// Attr is the metadata a file or directory carries.
type Attr struct {
	Mode    uint32  `json:"mode"` // permission bits with setuid/setgid/sticky (ModeMask)
	UID     uint32  `json:"uid"`
	GID     uint32  `json:"gid"`
	MtimeNs int64   `json:"mtime_ns"`
	Xattrs  []Xattr `json:"xattrs,omitempty"` // sorted by name, unique
}

// Tree is one directory: its own attributes and its entries sorted by name.
// A directory's attributes live in its own tree object, so the root of a
// workspace keeps its mode, owner and mtime like any other directory.
type Tree struct {
	Attr
	Entries []Entry `json:"entries"`
}

// Entry is one name in a directory. For a TypeDir entry only Name, Type and ID
// (the child tree) are set: the child's attributes are in the child tree.
type Entry struct {
	Name string `json:"name"`
	Type Type   `json:"type"`
	Attr
	Size   int64  `json:"size,omitempty"`   // file bytes; symlink target length
	ID     ID     `json:"id,omitzero"`      // file blob or directory tree
	Target string `json:"target,omitempty"` // symlink target, verbatim
	Major  uint32 `json:"major,omitempty"`  // device numbers
	Minor  uint32 `json:"minor,omitempty"`
	// LinkGroup names the hard-link group of a non-directory entry: the
	// slash-separated path, from the root, of the group's first member in
	// depth-first name order. Every member carries the same LinkGroup and
	// Nlink (the number of members in the whole root). Empty when the entry
	// has a single link.
	LinkGroup string `json:"link_group,omitempty"`
	Nlink     uint32 `json:"nlink,omitempty"`
	// Holes are the ranges of a sparse file that hold no data (see Hole);
	// nil for a file without holes and for every other type.
	Holes []Hole `json:"holes,omitempty"`
}

// Lookup finds name among t's entries.
func (t *Tree) Lookup(name string) (*Entry, bool) {
	i := sort.Search(len(t.Entries), func(i int) bool { return t.Entries[i].Name >= name })
	if i < len(t.Entries) && t.Entries[i].Name == name {
		return &t.Entries[i], true
	}
	return nil, false
}

// Encoding, version 1. Every integer is a minimal unsigned varint (mtime is
// zig-zag), every string or byte slice is its varint length then its bytes:
//
//	"ESFT" 0x01
//	mode uid gid mtime xattrs              (the directory itself)
//	count entry*                           (sorted by name, unique)
//	entry  = name type (dir: id[32]) |
//	         (mode uid gid mtime payload xattrs link)
//	payload = file: size id[32] | symlink: target | char/block: major minor | fifo: - |
//	          sparse file: size id[32] holes
//	holes  = count (gap length)*           (count >= 1; gap from the end of the previous hole)
//	xattrs = count (name value)*           (sorted by name, unique)
//	link   = group (empty: none) [nlink when group is set]
//
// A file with holes is written with the type byte TypeFile|typeHoles and
// decodes to a TypeFile entry with Holes set: a tree without sparse files
// encodes exactly as before holes were recorded, so its id never changed.
//
// Decode accepts exactly what Encode produces, so one tree has one id.
var treeMagic = []byte("ESFT\x01")

// typeHoles marks, in an encoded entry's type byte, a file followed by its
// holes. No Type has this bit.
const typeHoles = 0x80

const minEntryLen = 9

// EncodeTree validates t and returns its canonical bytes.
func EncodeTree(t *Tree) ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return appendTree(nil, t), nil
}

// TreeID encodes t and returns the bytes with their id.
func TreeID(t *Tree) ([]byte, ID, error) {
	b, err := EncodeTree(t)
	if err != nil {
		return nil, ZeroID, err
	}
	return b, Sum(b), nil
}

func appendTree(b []byte, t *Tree) []byte {
	b = append(b, treeMagic...)
	b = appendAttr(b, &t.Attr)
	b = appendXattrs(b, t.Xattrs)
	b = binary.AppendUvarint(b, uint64(len(t.Entries)))
	for i := range t.Entries {
		b = appendEntry(b, &t.Entries[i])
	}
	return b
}

func appendEntry(b []byte, e *Entry) []byte {
	b = appendString(b, e.Name)
	if e.Type == TypeFile && len(e.Holes) > 0 {
		b = append(b, byte(e.Type)|typeHoles)
	} else {
		b = append(b, byte(e.Type))
	}
	if e.Type == TypeDir {
		b = append(b, e.ID[:]...)
		return b
	}
	b = appendAttr(b, &e.Attr)
	switch e.Type {
	case TypeFile:
		b = binary.AppendUvarint(b, uint64(e.Size))
		b = append(b, e.ID[:]...)
		if len(e.Holes) > 0 {
			b = appendHoles(b, e.Holes)
		}
	case TypeSymlink:
		b = appendString(b, e.Target)
	case TypeCharDev, TypeBlockDev:
		b = binary.AppendUvarint(b, uint64(e.Major))
		b = binary.AppendUvarint(b, uint64(e.Minor))
	}
	b = appendXattrs(b, e.Xattrs)
	b = appendString(b, e.LinkGroup)
	if e.LinkGroup != "" {
		b = binary.AppendUvarint(b, uint64(e.Nlink))
	}
	return b
}

func appendAttr(b []byte, a *Attr) []byte {
	b = binary.AppendUvarint(b, uint64(a.Mode))
	b = binary.AppendUvarint(b, uint64(a.UID))
	b = binary.AppendUvarint(b, uint64(a.GID))
	return binary.AppendVarint(b, a.MtimeNs)
}

func appendXattrs(b []byte, xs []Xattr) []byte {
	b = binary.AppendUvarint(b, uint64(len(xs)))
	for _, x := range xs {
		b = appendString(b, x.Name)
		b = binary.AppendUvarint(b, uint64(len(x.Value)))
		b = append(b, x.Value...)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// DecodeTree parses canonical tree bytes. Anything that EncodeTree would not
// have produced, including valid content in a non-canonical form, is
// ErrCorrupt: a tree object is only ever read back from the store.
func DecodeTree(b []byte) (*Tree, error) {
	v, err := ParseTree(b)
	if err != nil {
		return nil, err
	}
	return v.Tree(), nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
	d.b = nil
}

func (d *decoder) uvarint(max uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	switch {
	case n <= 0:
		d.fail("bad varint")
		return 0
	case n != uvarintLen(v):
		d.fail("non-minimal varint")
		return 0
	case v > max:
		d.fail("value %d over limit %d", v, max)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	u := d.uvarint(^uint64(0))
	// Zig-zag, as binary.AppendVarint writes it.
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return x
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func (d *decoder) bytes(max int) []byte {
	n := d.uvarint(uint64(max))
	if d.err != nil {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.fail("truncated")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) id() ID {
	var id ID
	if d.err != nil {
		return id
	}
	if len(d.b) < IDSize {
		d.fail("truncated id")
		return id
	}
	copy(id[:], d.b)
	d.b = d.b[IDSize:]
	return id
}

func (d *decoder) byte1() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) attr(a *Attr) {
	a.Mode = uint32(d.uvarint(ModeMask))
	a.UID = uint32(d.uvarint(1<<32 - 1))
	a.GID = uint32(d.uvarint(1<<32 - 1))
	a.MtimeNs = d.varint()
}

func (d *decoder) xattrs() []Xattr {
	// Each xattr takes at least two bytes, which bounds the allocation by
	// the input instead of by a count an attacker chose.
	n := d.uvarint(uint64(len(d.b) / 2))
	if n == 0 {
		return nil
	}
	xs := make([]Xattr, 0, n)
	for range n {
		name := string(d.bytes(MaxXattrNameLen))
		val := d.bytes(MaxXattrValueLen)
		if d.err != nil {
			return nil
		}
		xs = append(xs, Xattr{Name: name, Value: bytes.Clone(val)})
	}
	return xs
}

// header reads the magic, the directory's own attributes and the entry
// count, bounded by the input.
func (d *decoder) header(a *Attr) uint64 {
	if !bytes.HasPrefix(d.b, treeMagic) {
		d.fail("not a version 1 tree")
		return 0
	}
	d.b = d.b[len(treeMagic):]
	d.attr(a)
	a.Xattrs = d.xattrs()
	// The smallest entry (a fifo with a one-byte name) takes minEntryLen
	// bytes; that bounds the allocation by the input.
	return d.uvarint(uint64(len(d.b) / minEntryLen))
}

// entry decodes one entry into e (which must be zero).
func (d *decoder) entry(e *Entry) {
	e.Name = string(d.bytes(MaxNameLen))
	typ := d.byte1()
	holes := typ == byte(TypeFile)|typeHoles
	if holes {
		typ = byte(TypeFile)
	}
	e.Type = Type(typ)
	if e.Type == TypeDir {
		e.ID = d.id()
		return
	}
	d.attr(&e.Attr)
	switch e.Type {
	case TypeFile:
		e.Size = int64(d.uvarint(1<<63 - 1))
		e.ID = d.id()
		if holes {
			e.Holes = d.holes()
		}
	case TypeSymlink:
		e.Target = string(d.bytes(MaxTargetLen))
		e.Size = int64(len(e.Target))
	case TypeCharDev, TypeBlockDev:
		e.Major = uint32(d.uvarint(1<<32 - 1))
		e.Minor = uint32(d.uvarint(1<<32 - 1))
	case TypeFIFO:
	default:
		d.fail("entry %q: unknown type %d", e.Name, e.Type)
	}
	e.Xattrs = d.xattrs()
	e.LinkGroup = string(d.bytes(4096))
	if e.LinkGroup != "" {
		e.Nlink = uint32(d.uvarint(1<<32 - 1))
	}
}

// Validate checks the invariants of the canonical form: sorted unique valid
// names, known types, fields that belong to the type and no others, sorted
// unique xattrs, and well-formed hard-link groups.
func (t *Tree) Validate() error {
	if err := validateAttr(&t.Attr); err != nil {
		return fmt.Errorf("directory: %w", err)
	}
	for i := range t.Entries {
		e := &t.Entries[i]
		if err := ValidName(e.Name); err != nil {
			return err
		}
		if i > 0 && t.Entries[i-1].Name >= e.Name {
			return fmt.Errorf("entries not sorted or not unique at %q: %w", e.Name, ErrInvalidArgument)
		}
		if err := validateEntry(e); err != nil {
			return fmt.Errorf("entry %q: %w", e.Name, err)
		}
	}
	return nil
}

func validateEntry(e *Entry) error {
	bad := func(what string) error { return fmt.Errorf("%s: %w", what, ErrInvalidArgument) }
	if e.Type != TypeFile && len(e.Holes) > 0 {
		return bad("holes in a non-file")
	}
	if e.Type == TypeDir {
		if e.Attr.Mode != 0 || e.UID != 0 || e.GID != 0 || e.MtimeNs != 0 || len(e.Xattrs) != 0 ||
			e.Size != 0 || e.Target != "" || e.Major != 0 || e.Minor != 0 || e.LinkGroup != "" || e.Nlink != 0 {
			return bad("directory entry carries attributes (they belong in its tree)")
		}
		if e.ID.IsZero() {
			return bad("directory entry without tree id")
		}
		return nil
	}
	if err := validateAttr(&e.Attr); err != nil {
		return err
	}
	switch e.Type {
	case TypeFile:
		if e.Size < 0 {
			return bad("negative size")
		}
		if e.ID.IsZero() {
			return bad("file without content id")
		}
		if e.Target != "" || e.Major != 0 || e.Minor != 0 {
			return bad("file with symlink or device fields")
		}
		if err := validateHoles(e.Holes, e.Size); err != nil {
			return err
		}
	case TypeSymlink:
		if e.Target == "" || len(e.Target) > MaxTargetLen || strings.IndexByte(e.Target, 0) >= 0 {
			return bad("symlink target empty, too long or with NUL")
		}
		if e.Size != int64(len(e.Target)) || !e.ID.IsZero() || e.Major != 0 || e.Minor != 0 {
			return bad("symlink with size, content id or device fields")
		}
	case TypeCharDev, TypeBlockDev, TypeFIFO:
		if e.Size != 0 || !e.ID.IsZero() || e.Target != "" {
			return bad("special file with size, content id or target")
		}
		if e.Type == TypeFIFO && (e.Major != 0 || e.Minor != 0) {
			return bad("fifo with device numbers")
		}
	default:
		return bad(fmt.Sprintf("unknown type %d", e.Type))
	}
	if e.LinkGroup == "" {
		if e.Nlink != 0 {
			return bad("nlink without link group")
		}
	} else {
		if err := ValidPath(e.LinkGroup); err != nil {
			return err
		}
		if e.Nlink < 2 {
			return bad("link group with fewer than two links")
		}
	}
	return nil
}

func validateAttr(a *Attr) error {
	if a.Mode&^ModeMask != 0 {
		return fmt.Errorf("mode %o has bits outside %o: %w", a.Mode, ModeMask, ErrInvalidArgument)
	}
	for i, x := range a.Xattrs {
		if x.Name == "" || len(x.Name) > MaxXattrNameLen || strings.IndexByte(x.Name, 0) >= 0 {
			return fmt.Errorf("xattr name %q: %w", x.Name, ErrInvalidArgument)
		}
		if len(x.Value) > MaxXattrValueLen {
			return fmt.Errorf("xattr %q: value over %d bytes: %w", x.Name, MaxXattrValueLen, ErrInvalidArgument)
		}
		if i > 0 && a.Xattrs[i-1].Name >= x.Name {
			return fmt.Errorf("xattrs not sorted or not unique at %q: %w", x.Name, ErrInvalidArgument)
		}
	}
	return nil
}

// ValidName reports whether name can be one directory entry: not empty, not
// "." or "..", no slash, no NUL, at most MaxNameLen bytes. Export relies on
// it: a name that passes can never step out of its directory.
func ValidName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > MaxNameLen ||
		strings.IndexByte(name, '/') >= 0 || strings.IndexByte(name, 0) >= 0 {
		return fmt.Errorf("entry name %q: %w", name, ErrInvalidArgument)
	}
	return nil
}

// ValidPath reports whether p is a clean relative path of valid names
// ("a/b/c"); the empty path names the root and is not valid here.
func ValidPath(p string) error {
	if p == "" {
		return fmt.Errorf("empty path: %w", ErrInvalidArgument)
	}
	for _, c := range strings.Split(p, "/") {
		if err := ValidName(c); err != nil {
			return fmt.Errorf("path %q: %w", p, err)
		}
	}
	return nil
}

// SortXattrs sorts xs by name in place, the canonical order.
func SortXattrs(xs []Xattr) {
	sort.Slice(xs, func(i, j int) bool { return xs[i].Name < xs[j].Name })
}

// SortEntries sorts es by name in place, the canonical order.
func SortEntries(es []Entry) {
	sort.Slice(es, func(i, j int) bool { return es[i].Name < es[j].Name })
}
