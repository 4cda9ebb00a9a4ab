package v1

import (
	"encoding/hex"
	"fmt"

	"github.com/esf-dev/esf/errdefs"
)

// IDSize is the size of an object id (a BLAKE3-256 digest).
const IDSize = 32

// ID names a stored object; on the wire it is 64 lowercase hex digits.
type ID [IDSize]byte

// ParseID parses the 64-digit hex form of an id.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*IDSize {
		return id, fmt.Errorf("object id %q: want %d hex digits: %w", s, 2*IDSize, errdefs.ErrInvalidArgument)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("object id %q: %v: %w", s, err, errdefs.ErrInvalidArgument)
	}
	return id, nil
}

// String is the lowercase hex form.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Short is the first 12 hex digits, for humans.
func (id ID) Short() string { return id.String()[:12] }

// IsZero reports whether id is the zero id, which names nothing.
func (id ID) IsZero() bool { return id == ID{} }

// MarshalText implements encoding.TextMarshaler (hex).
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler (hex).
func (id *ID) UnmarshalText(b []byte) error {
	p, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = p
	return nil
}

// Type is the kind of a tree entry.
type Type uint8

// The entry types.
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
	return fmt.Errorf("entry type %q: %w", b, errdefs.ErrInvalidArgument)
}

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

// Hole is a range of a sparse file that holds no data: it reads as zeros
// and takes no space where the file is stored. Holes are layout, not
// content: a file's blob holds every byte (the zeros of its holes
// included), so the same bytes have the same id whether or not they were
// sparse, and the holes live in the file's tree entry.
//
// An entry's holes are sorted, each is non-empty, two holes are always
// separated by data (adjacent holes are one hole), and the last ends at
// the latest at the file's size.
type Hole struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}
