package ingest

import (
	"bytes"
	"errors"
	"io"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// fileHoles maps the holes of the open regular file fd, whose fstat is
// st, with SEEK_HOLE/SEEK_DATA. A file that takes as many blocks as its
// size needs has none worth asking about (GNU cp and tar use the same
// test), so dense files cost no system call; a filesystem that cannot seek
// holes has none. It leaves the file offset at 0.
func fileHoles(fd int, st *unix.Stat_t) ([]cas.Hole, error) {
	size := st.Size
	if size == 0 || st.Blocks*512 >= size {
		return nil, nil
	}
	var hs []cas.Hole
	for pos := int64(0); pos < size; {
		hole, err := unix.Seek(fd, pos, unix.SEEK_HOLE)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			hs = nil
			break
		}
		if errors.Is(err, unix.ENXIO) {
			break // the file shrank
		}
		if err != nil {
			return nil, err
		}
		if hole >= size {
			break
		}
		data, err := unix.Seek(fd, hole, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = size // a hole to the end
		} else if err != nil {
			return nil, err
		}
		data = min(data, size)
		if data <= hole {
			break // raced with a writer; the read will tell
		}
		hs = append(hs, cas.Hole{Off: hole, Len: data - hole})
		pos = data
	}
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
		return nil, err
	}
	return hs, nil
}

// holeCheck reads a file whose holes were mapped before the read and
// checks that every byte in a hole reads as zero. A file written while we
// read it may have gained data there; its holes are then dropped rather
// than recorded wrong: a tree must never claim a hole where its blob holds
// data.
type holeCheck struct {
	r     io.Reader
	holes []cas.Hole
	size  int64 // the size the holes were mapped for
	next  int   // the first hole not yet read past
	pos   int64
	bad   bool
}

func (c *holeCheck) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if !c.bad && c.next < len(c.holes) {
		c.check(p[:n])
	}
	c.pos += int64(n)
	return n, err
}

func (c *holeCheck) check(b []byte) {
	start, end := c.pos, c.pos+int64(len(b))
	for ; c.next < len(c.holes); c.next++ {
		h := c.holes[c.next]
		if h.Off >= end {
			return
		}
		if lo, hi := max(start, h.Off), min(end, h.End()); lo < hi && !allZero(b[lo-start:hi-start]) {
			c.bad = true
			return
		}
		if h.End() > end {
			return
		}
	}
}

// result is the holes to record for content of size bytes read whole.
func (c *holeCheck) result(size int64) []cas.Hole {
	if c.bad || size != c.size || c.pos != size {
		return nil
	}
	return c.holes
}

var zeros = make([]byte, 64<<10)

func allZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
