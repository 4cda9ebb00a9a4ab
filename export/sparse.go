package export

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// sparseWriter writes a file's content at its offsets and leaves its holes
// unwritten, so the exported file is as sparse as the tree says; the
// caller truncates it to its size at the end (a file may end in a hole).
// Every byte the content has in a hole must be zero: a tree whose holes
// cover data is lying about its file, which is ErrCorrupt. Positions come
// from the content stream alone, never from the hole list, so a malformed
// list can only fail the export.
type sparseWriter struct {
	fd    int
	holes []cas.Hole
	pos   int64
}

func (w *sparseWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		for len(w.holes) > 0 && w.holes[0].End() <= w.pos {
			w.holes = w.holes[1:]
		}
		// The next run: up to the next hole edge, data or hole.
		run, hole := int64(len(p)), false
		if len(w.holes) > 0 {
			h := w.holes[0]
			if w.pos >= h.Off {
				run, hole = min(run, h.End()-w.pos), true
			} else {
				run = min(run, h.Off-w.pos)
			}
		}
		chunk := p[:run]
		if hole {
			if !cas.IsZero(chunk) {
				return 0, fmt.Errorf("content holds data in the hole at %d: %w", w.pos, ErrCorrupt)
			}
		} else if err := pwriteAll(w.fd, chunk, w.pos); err != nil {
			return 0, err
		}
		w.pos += run
		p = p[run:]
	}
	return n, nil
}

func pwriteAll(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		m, err := unix.Pwrite(fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		p, off = p[m:], off+int64(m)
	}
	return nil
}
