package cas

import (
	"encoding/hex"
	"fmt"
	"hash"

	"github.com/zeebo/blake3"
)

// IDSize is the size of an object id in bytes.
const IDSize = 32

// ID names an object: the BLAKE3-256 digest of its bytes.
type ID [IDSize]byte

// ZeroID is the id of nothing; it never names a stored object.
var ZeroID ID

// Sum returns the id of b.
func Sum(b []byte) ID { return ID(blake3.Sum256(b)) }

// NewHasher returns a hash.Hash whose Sum is an ID's bytes.
func NewHasher() hash.Hash { return blake3.New() }

// IDFromHash reads the digest of h, which must come from NewHasher.
func IDFromHash(h hash.Hash) ID {
	var id ID
	h.Sum(id[:0])
	return id
}

// String is the lowercase hex form used everywhere ids are shown.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Short is the first 12 hex digits, for humans.
func (id ID) Short() string { return id.String()[:12] }

// IsZero reports whether id is ZeroID.
func (id ID) IsZero() bool { return id == ZeroID }

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

// ParseID parses the 64-digit hex form of an id.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*IDSize {
		return id, fmt.Errorf("object id %q: want %d hex digits: %w", s, 2*IDSize, ErrInvalidArgument)
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, fmt.Errorf("object id %q: %v: %w", s, err, ErrInvalidArgument)
	}
	return id, nil
}
