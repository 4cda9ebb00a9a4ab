package cas

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
)

// leafSet holds a Builder directory's non-directory entries encoded, as the
// tree format writes them, in an arena: about sixty bytes and a four-byte
// offset for a plain file, where a decoded Entry in a map takes several
// hundred. Records are only ever appended: a replaced or removed entry
// stays in the arena until the Builder is dropped, so memory grows with
// the changes staged, as it did when every change was a node.
//
// sorted lists the live records by name; tail the records appended since
// the last flush, in order, a later one winning over an earlier one of the
// same name, and a tombstone (a name followed by a zero type byte)
// removing the name. flush merges tail into sorted.
type leafSet struct {
	a      arena
	sorted []uint32
	tail   []uint32
}

const tombstone = 0

func (s *leafSet) empty() bool { return len(s.sorted) == 0 && len(s.tail) == 0 }

// len is the number of live leaves; only exact after flush.
func (s *leafSet) len() int { return len(s.sorted) }

func (s *leafSet) name(off uint32) []byte { return nameAt(s.a.at(off), 0) }

func (s *leafSet) isTombstone(off uint32) bool {
	b := s.a.at(off)
	n, k := binary.Uvarint(b)
	return b[k+int(n)] == tombstone
}

func (s *leafSet) decode(off uint32) (Entry, error) {
	var e Entry
	d := decoder{b: s.a.at(off)}
	d.entry(&e)
	if d.err != nil {
		// Records are written by put or come from a verified tree.
		return Entry{}, fmt.Errorf("staged entry: %v: %w", d.err, ErrCorrupt)
	}
	return e, nil
}

// put stages e, a valid entry with its name, replacing its name's leaf.
func (s *leafSet) put(e *Entry) error {
	return s.append(appendEntry(nil, e))
}

// remove stages the removal of name (present or not).
func (s *leafSet) remove(name string) error {
	if s.empty() {
		return nil
	}
	return s.append(append(appendString(nil, name), tombstone))
}

func (s *leafSet) append(rec []byte) error {
	off, err := s.a.add(rec)
	if err != nil {
		return err
	}
	s.tail = append(s.tail, off)
	// Merging costs a pass over sorted: doing it when tail has grown by a
	// fraction of sorted keeps the total cost of n puts at O(n log n).
	if len(s.tail) > 1024 && len(s.tail) > len(s.sorted)/2 {
		return s.flush()
	}
	return nil
}

// get returns the live leaf name.
func (s *leafSet) get(name string) (Entry, bool, error) {
	// A lookup scans tail: keep it short relative to sorted, whose merge it
	// would otherwise cost on every lookup.
	if len(s.tail) > 64+len(s.sorted)/256 {
		if err := s.flush(); err != nil {
			return Entry{}, false, err
		}
	}
	for i := len(s.tail) - 1; i >= 0; i-- {
		if off := s.tail[i]; string(s.name(off)) == name {
			if s.isTombstone(off) {
				return Entry{}, false, nil
			}
			e, err := s.decode(off)
			return e, err == nil, err
		}
	}
	i := sort.Search(len(s.sorted), func(i int) bool { return string(s.name(s.sorted[i])) >= name })
	if i < len(s.sorted) && string(s.name(s.sorted[i])) == name {
		e, err := s.decode(s.sorted[i])
		return e, err == nil, err
	}
	return Entry{}, false, nil
}

// flush merges tail into sorted.
func (s *leafSet) flush() error {
	if len(s.tail) == 0 {
		return nil
	}
	tail := s.tail
	sort.SliceStable(tail, func(i, j int) bool { return bytes.Compare(s.name(tail[i]), s.name(tail[j])) < 0 })
	out := make([]uint32, 0, len(s.sorted)+len(tail))
	i := 0
	for j := 0; j < len(tail); j++ {
		name := s.name(tail[j])
		// The last of a run of one name wins.
		for j+1 < len(tail) && bytes.Equal(s.name(tail[j+1]), name) {
			j++
		}
		rest := s.sorted[i:]
		k := sort.Search(len(rest), func(k int) bool { return bytes.Compare(s.name(rest[k]), name) >= 0 })
		out = append(out, rest[:k]...)
		i += k
		if i < len(s.sorted) && bytes.Equal(s.name(s.sorted[i]), name) {
			i++ // replaced or removed
		}
		if !s.isTombstone(tail[j]) {
			out = append(out, tail[j])
		}
	}
	out = append(out, s.sorted[i:]...)
	s.sorted, s.tail = out, nil
	return nil
}

// records calls fn with the name and the encoded record of every live
// leaf in name order, without decoding them; flush first.
func (s *leafSet) records(fn func(name, rec []byte) error) error {
	for _, off := range s.sorted {
		b := s.a.at(off)
		n := entryLen(b)
		if n < 0 {
			return fmt.Errorf("staged entry %q: %w", s.name(off), ErrCorrupt)
		}
		if err := fn(nameAt(b, 0), b[:n]); err != nil {
			return err
		}
	}
	return nil
}

// size is the encoded size of the live leaves; flush first.
func (s *leafSet) size() int {
	total := 0
	for _, off := range s.sorted {
		total += max(0, entryLen(s.a.at(off)))
	}
	return total
}

// entryLen is the length of the encoded entry at the start of b (valid:
// written by appendEntry or read from a verified tree), or -1. It
// allocates nothing.
func entryLen(b []byte) int {
	d := decoder{b: b}
	d.bytes(MaxNameLen)
	typ := d.byte1()
	holes := typ == byte(TypeFile)|typeHoles
	if holes {
		typ = byte(TypeFile)
	}
	if Type(typ) == TypeDir {
		d.id()
	} else {
		var a Attr
		d.attr(&a)
		switch Type(typ) {
		case TypeFile:
			d.uvarint(1<<63 - 1)
			d.id()
			if holes {
				for range d.uvarint(uint64(len(d.b))) {
					d.uvarint(1<<63 - 1)
					d.uvarint(1<<63 - 1)
				}
			}
		case TypeSymlink:
			d.bytes(MaxTargetLen)
		case TypeCharDev, TypeBlockDev:
			d.uvarint(1<<32 - 1)
			d.uvarint(1<<32 - 1)
		}
		for range d.uvarint(uint64(len(d.b))) {
			d.bytes(MaxXattrNameLen)
			d.bytes(MaxXattrValueLen)
		}
		if len(d.bytes(4096)) > 0 {
			d.uvarint(1<<32 - 1)
		}
	}
	if d.err != nil {
		return -1
	}
	return len(b) - len(d.b)
}

// adopt makes the records at offs (sorted, unique, live) of the tree bytes
// b the whole set, without copying them. The set must be empty.
func (s *leafSet) adopt(b []byte, offs []uint32) error {
	base, err := s.a.adopt(b)
	if err != nil {
		return err
	}
	for i := range offs {
		offs[i] += base
	}
	s.sorted = offs
	return nil
}

// arena stores records in slots of up to chunkSize bytes: an offset is a
// slot number and a position in it, so a slot may grow (and move) without
// changing the offsets into it, and the arena never copies more than one
// slot to grow. A buffer larger than a slot is adopted as it is and spans
// several slot numbers, each a suffix of it.
type arena struct {
	slots [][]byte
	open  bool // the last slot takes appends
}

const (
	chunkShift = 20
	chunkSize  = 1 << chunkShift
	maxSlots   = 1 << (32 - chunkShift)
)

func (a *arena) at(off uint32) []byte {
	return a.slots[off>>chunkShift][off&(chunkSize-1):]
}

func (a *arena) add(rec []byte) (uint32, error) {
	if len(rec) > chunkSize/2 {
		return a.adopt(rec)
	}
	n := len(a.slots)
	if !a.open || len(a.slots[n-1])+len(rec) > chunkSize {
		if n >= maxSlots {
			return 0, fmt.Errorf("directory over %d bytes of entries: %w", uint64(maxSlots)*chunkSize, ErrInvalidArgument)
		}
		a.slots = append(a.slots, make([]byte, 0, max(256, len(rec))))
		a.open = true
		n++
	}
	cur := a.slots[n-1]
	off := uint32(n-1)<<chunkShift | uint32(len(cur))
	if len(cur)+len(rec) > cap(cur) {
		grown := make([]byte, len(cur), min(chunkSize, max(2*cap(cur), len(cur)+len(rec))))
		copy(grown, cur)
		cur = grown
	}
	a.slots[n-1] = append(cur, rec...)
	return off, nil
}

// adopt adds b, which must not change, as it is and returns its offset.
func (a *arena) adopt(b []byte) (uint32, error) {
	need := max(1, (len(b)+chunkSize-1)>>chunkShift)
	if len(a.slots)+need > maxSlots {
		return 0, fmt.Errorf("directory over %d bytes of entries: %w", uint64(maxSlots)*chunkSize, ErrInvalidArgument)
	}
	base := uint32(len(a.slots)) << chunkShift
	for j := range need {
		a.slots = append(a.slots, b[j<<chunkShift:])
	}
	a.open = false
	return base, nil
}
