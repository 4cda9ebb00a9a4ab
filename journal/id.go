package journal

import (
	"crypto/rand"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Kind is the prefix that names what an id identifies.
type Kind string

// The kinds of durable records. An id is "<kind>_<suffix>".
const (
	KindGroup      Kind = "grp"
	KindNode       Kind = "node"
	KindAttempt    Kind = "att"
	KindEvaluation Kind = "eval"
	KindLease      Kind = "lease"
)

var kinds = []Kind{KindGroup, KindNode, KindAttempt, KindEvaluation, KindLease}

// maxIDSuffix bounds a suffix so keys built from ids stay far below MaxKeySize.
const maxIDSuffix = 64

// crockford is Crockford's base32 alphabet in lower case; its characters
// ascend in ASCII, so the encoding sorts like the number it encodes.
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// IDGen makes ids whose suffix is 26 base32 digits of 128 bits: 48 bits of
// Unix milliseconds, then 80 random bits. Ids from one generator are strictly
// increasing even within a millisecond or when the clock steps back (the
// random part is incremented instead), so the index scans of keys.go list in
// creation order. Ids from different processes order by millisecond only.
// Safe for concurrent use.
type IDGen struct {
	now  func() time.Time
	rand io.Reader

	mu     sync.Mutex
	lastMS uint64
	last   [10]byte
}

// NewIDGen returns a generator reading the clock now and the randomness
// source rand; nil means time.Now and crypto/rand.
func NewIDGen(now func() time.Time, rand io.Reader) *IDGen {
	if now == nil {
		now = time.Now
	}
	if rand == nil {
		rand = cryptoReader{}
	}
	return &IDGen{now: now, rand: rand}
}

type cryptoReader struct{}

func (cryptoReader) Read(b []byte) (int, error) { return rand.Read(b) }

var defaultIDGen = NewIDGen(nil, nil)

// NewID makes an id of kind k with the default generator.
func NewID(k Kind) (string, error) { return defaultIDGen.New(k) }

// New makes an id of kind k.
func (g *IDGen) New(k Kind) (string, error) {
	if !k.valid() {
		return "", fmt.Errorf("new id: kind %q: %w", k, ErrInvalidArgument)
	}
	ms := uint64(g.now().UnixMilli()) & (1<<48 - 1)
	var v [16]byte
	g.mu.Lock()
	if ms <= g.lastMS {
		// Same millisecond (or a clock step back): stay on the last
		// timestamp and count up, which keeps ids strictly increasing.
		ms = g.lastMS
		if !increment(g.last[:]) {
			ms++
			if _, err := io.ReadFull(g.rand, g.last[:]); err != nil {
				g.mu.Unlock()
				return "", fmt.Errorf("new id: read random: %w", err)
			}
		}
	} else if _, err := io.ReadFull(g.rand, g.last[:]); err != nil {
		g.mu.Unlock()
		return "", fmt.Errorf("new id: read random: %w", err)
	}
	g.lastMS = ms
	copy(v[6:], g.last[:])
	g.mu.Unlock()
	for i := 0; i < 6; i++ {
		v[i] = byte(ms >> (40 - 8*i))
	}
	return string(k) + "_" + encode128(v), nil
}

// increment adds one to the big-endian number b; false on overflow.
func increment(b []byte) bool {
	for i := len(b) - 1; i >= 0; i-- {
		b[i]++
		if b[i] != 0 {
			return true
		}
	}
	return false
}

// encode128 writes v as 26 base32 digits (130 bits, the top two zero).
func encode128(v [16]byte) string {
	hi := uint64(v[0])<<56 | uint64(v[1])<<48 | uint64(v[2])<<40 | uint64(v[3])<<32 |
		uint64(v[4])<<24 | uint64(v[5])<<16 | uint64(v[6])<<8 | uint64(v[7])
	lo := uint64(v[8])<<56 | uint64(v[9])<<48 | uint64(v[10])<<40 | uint64(v[11])<<32 |
		uint64(v[12])<<24 | uint64(v[13])<<16 | uint64(v[14])<<8 | uint64(v[15])
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

func (k Kind) valid() bool {
	for _, c := range kinds {
		if k == c {
			return true
		}
	}
	return false
}

// KindOf returns the kind named by id's prefix; a malformed id wraps
// ErrInvalidArgument.
func KindOf(id string) (Kind, error) {
	k, _, ok := strings.Cut(id, "_")
	if !ok || !Kind(k).valid() {
		return "", fmt.Errorf("id %q: unknown kind: %w", id, ErrInvalidArgument)
	}
	return Kind(k), CheckID(Kind(k), id)
}

// CheckID checks that id is well formed and of kind k: "<k>_" and 1..64
// characters of [0-9a-z]. It accepts more than NewID makes so that fixtures
// and future generators stay valid; ids never contain '/', which the key
// layout relies on. A violation wraps ErrInvalidArgument.
func CheckID(k Kind, id string) error {
	suffix, ok := strings.CutPrefix(id, string(k)+"_")
	if !ok {
		return fmt.Errorf("%q is not a %s id: %w", id, k.noun(), ErrInvalidArgument)
	}
	if len(suffix) == 0 || len(suffix) > maxIDSuffix {
		return fmt.Errorf("%s id %q: want 1..%d characters after %q: %w", k.noun(), id, maxIDSuffix, string(k)+"_", ErrInvalidArgument)
	}
	for i := 0; i < len(suffix); i++ {
		c := suffix[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z') {
			return fmt.Errorf("%s id %q: character %q: %w", k.noun(), id, c, ErrInvalidArgument)
		}
	}
	return nil
}

func (k Kind) noun() string {
	switch k {
	case KindGroup:
		return "group"
	case KindNode:
		return "node"
	case KindAttempt:
		return "attempt"
	case KindEvaluation:
		return "evaluation"
	case KindLease:
		return "lease"
	}
	return string(k)
}
