package cas

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

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

// End is the offset just past the hole.
func (h Hole) End() int64 { return h.Off + h.Len }

func validateHoles(hs []Hole, size int64) error {
	end := int64(0)
	for i, h := range hs {
		switch {
		case h.Len <= 0 || h.Off < 0:
			return fmt.Errorf("hole %d at %d: empty or negative: %w", i, h.Off, ErrInvalidArgument)
		case h.Off < end || (i > 0 && h.Off == end):
			return fmt.Errorf("hole %d at %d: overlaps or touches the previous one: %w", i, h.Off, ErrInvalidArgument)
		case h.Off > size || h.Len > size-h.Off:
			return fmt.Errorf("hole %d at %d+%d: past the size %d: %w", i, h.Off, h.Len, size, ErrInvalidArgument)
		}
		end = h.End()
	}
	return nil
}

func appendHoles(b []byte, hs []Hole) []byte {
	b = binary.AppendUvarint(b, uint64(len(hs)))
	end := int64(0)
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(h.Off-end))
		b = binary.AppendUvarint(b, uint64(h.Len))
		end = h.End()
	}
	return b
}

// holes reads at least one hole; Validate checks them against the size.
func (d *decoder) holes() []Hole {
	// Each hole takes at least two bytes, which bounds the allocation by
	// the input.
	n := d.uvarint(uint64(len(d.b) / 2))
	if d.err == nil && n == 0 {
		d.fail("sparse file without holes")
	}
	if d.err != nil {
		return nil
	}
	hs := make([]Hole, 0, n)
	end := uint64(0)
	for range n {
		off := end + d.uvarint(1<<63-1-end)
		length := d.uvarint(1<<63 - 1 - off)
		if d.err != nil {
			return nil
		}
		hs = append(hs, Hole{Off: int64(off), Len: int64(length)})
		end = off + length
	}
	return hs
}

// SeekData is lseek(SEEK_DATA) over a file of size bytes with holes hs:
// the first offset at or after off that holds data, or ok false when
// there is none (ENXIO).
func SeekData(hs []Hole, size, off int64) (int64, bool) {
	if off < 0 || off >= size {
		return 0, false
	}
	for _, h := range hs {
		if off < h.Off {
			break
		}
		if off < h.End() {
			off = h.End()
			break
		}
	}
	return off, off < size
}

// SeekHole is lseek(SEEK_HOLE): the first offset at or after off that is
// in a hole, counting the end of the file as one; ok is false when off is
// at or past the end (ENXIO).
func SeekHole(hs []Hole, size, off int64) (int64, bool) {
	if off < 0 || off >= size {
		return 0, false
	}
	for _, h := range hs {
		if off < h.End() {
			return max(off, h.Off), true
		}
	}
	return size, true
}

// DataBlocks counts the blocks of blockSize bytes a file of size bytes
// with holes hs keeps data in: a block that any data byte touches counts.
// This is the file's allocation where it is stored (st_blocks is this
// count for 512-byte units at the filesystem's block size).
func DataBlocks(hs []Hole, size, blockSize int64) int64 {
	n, pos, last := int64(0), int64(0), int64(-1) // last: the last block counted
	data := func(from, to int64) {
		if from >= to {
			return
		}
		first, end := from/blockSize, (to-1)/blockSize
		if first <= last {
			first = last + 1
		}
		if end >= first {
			n += end - first + 1
			last = end
		}
	}
	for _, h := range hs {
		data(pos, h.Off)
		pos = h.End()
	}
	data(pos, size)
	return n
}

var zeros = make([]byte, 64<<10)

// IsZero reports whether b holds only zero bytes.
func IsZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// HoleCheck is a Writer that checks a file's content, streamed through it
// from the start, against the file's holes: every byte inside a hole must
// be zero. From the first one that is not, Write and Err return an error
// wrapping ErrCorrupt. Holes must be valid (as Validate checks them).
type HoleCheck struct {
	holes []Hole
	pos   int64
	err   error
}

// NewHoleCheck returns a check of content against hs.
func NewHoleCheck(hs []Hole) *HoleCheck { return &HoleCheck{holes: hs} }

func (c *HoleCheck) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	start, end := c.pos, c.pos+int64(len(p))
	for len(c.holes) > 0 {
		h := c.holes[0]
		if h.Off >= end {
			break
		}
		if lo, hi := max(start, h.Off), min(end, h.End()); lo < hi && !IsZero(p[lo-start:hi-start]) {
			c.err = fmt.Errorf("data in the hole at %d+%d: %w", h.Off, h.Len, ErrCorrupt)
			return 0, c.err
		}
		if h.End() > end {
			break
		}
		c.holes = c.holes[1:]
	}
	c.pos = end
	return len(p), nil
}

// Err is the first hole found holding data, or nil.
func (c *HoleCheck) Err() error { return c.err }

// Written is the number of bytes checked so far.
func (c *HoleCheck) Written() int64 { return c.pos }
