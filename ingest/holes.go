package ingest

import (
	"archive/tar"
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
	check *cas.HoleCheck
}

func newHoleCheck(r io.Reader, holes []cas.Hole, size int64) *holeCheck {
	return &holeCheck{r: r, holes: holes, size: size, check: cas.NewHoleCheck(holes)}
}

func (c *holeCheck) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.check.Write(p[:n]) // a failure stays in check.Err
	return n, err
}

// result is the holes to record for content of size bytes read whole.
func (c *holeCheck) result(size int64) []cas.Hole {
	if c.check.Err() != nil || size != c.size || c.check.Written() != size {
		return nil
	}
	return c.holes
}

// archiveCounter counts the bytes a tar reader takes from its archive:
// for a member the archive stores sparse, the tar reader makes up the
// zeros of the holes without reading anything, so a block that cost no
// archive bytes was a hole.
type archiveCounter struct {
	r io.Reader
	n int64
}

func (c *archiveCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// sparseMember reports whether the archive stores hdr's member sparse:
// the old GNU format or GNU's PAX records (versions 0.0, 0.1 and 1.0).
func sparseMember(hdr *tar.Header) bool {
	return hdr.Typeflag == tar.TypeGNUSparse || hdr.PAXRecords["GNU.sparse.major"] != "" ||
		hdr.PAXRecords["GNU.sparse.map"] != ""
}

// holeBlock is the granularity of holes found in a tar member: a
// filesystem's block, which is what a sparse map made from SEEK_HOLE
// describes.
const holeBlock = 4096

// tarHoles reads a sparse tar member one block at a time and records as
// holes the blocks for which the archive held no bytes, so the tree gets
// the member's sparse map (at block granularity), not a guess from zeros.
type tarHoles struct {
	r       io.Reader // the member
	archive *archiveCounter
	pos     int64
	holes   []cas.Hole
	buf     [holeBlock]byte
	pending []byte // read from r, not yet returned
	err     error
}

func (h *tarHoles) Read(p []byte) (int, error) {
	if len(h.pending) == 0 {
		if h.err != nil {
			return 0, h.err
		}
		before := h.archive.n
		n, err := io.ReadFull(h.r, h.buf[:])
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		h.err = err
		if n > 0 && h.archive.n == before && cas.IsZero(h.buf[:n]) {
			h.hole(h.pos, int64(n))
		}
		h.pos += int64(n)
		h.pending = h.buf[:n]
		if n == 0 {
			return 0, h.err
		}
	}
	n := copy(p, h.pending)
	h.pending = h.pending[n:]
	return n, nil
}

func (h *tarHoles) hole(off, n int64) {
	if k := len(h.holes); k > 0 && h.holes[k-1].End() == off {
		h.holes[k-1].Len += n
		return
	}
	h.holes = append(h.holes, cas.Hole{Off: off, Len: n})
}

// result is the holes to record for a member of size bytes.
func (h *tarHoles) result(size int64) []cas.Hole {
	if h.pos != size {
		return nil
	}
	return h.holes
}
