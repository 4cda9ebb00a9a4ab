package export

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// kcopyChunk is how much one copy_file_range call asks for: cancellation
// and progress are checked between calls.
const kcopyChunk = 64 << 20

// copyVerified copies the content of e into fd in the kernel from the
// store's verified raw file of it (Options.VerifiedFile), and reports
// whether it did. It does not when there is no such file, when the entry
// has holes (they are written as holes by the streaming path), or when the
// kernel cannot copy between the two files (then fd is left empty and the
// caller streams). copy_file_range shares the extents where the file system
// can (a reflink on btrfs or XFS: copy on write, never an alias the user
// could write through) and copies in the kernel elsewhere.
func (x *dirExporter) copyVerified(fd int, e *cas.Entry) (bool, int64, error) {
	if x.opts.VerifiedFile == nil || len(e.Holes) > 0 || e.Size < kcopyMin {
		return false, 0, nil
	}
	src := x.opts.VerifiedFile(e.ID)
	if src == nil {
		return false, 0, nil
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil || fi.Size() != e.Size || !fi.Mode().IsRegular() {
		// Not the entry's content: the streaming path says why.
		return false, 0, nil
	}
	var n int64
	for n < e.Size {
		if err := x.ctx.Err(); err != nil {
			return true, n, err
		}
		roff, woff := n, n
		m, err := unix.CopyFileRange(int(src.Fd()), &roff, fd, &woff, int(min(e.Size-n, kcopyChunk)), 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || m == 0 {
			if n == 0 && (err == unix.EXDEV || err == unix.EINVAL || err == unix.ENOSYS || err == unix.EOPNOTSUPP) {
				return false, 0, nil
			}
			if err == nil {
				err = fmt.Errorf("blob %s: ends at %d of %d bytes: %w", e.ID.Short(), n, e.Size, ErrCorrupt)
			}
			return true, n, fmt.Errorf("copy_file_range: %w", err)
		}
		n += int64(m)
		x.opts.Progress(int64(m))
	}
	return true, n, nil
}

// kcopyMin is the smallest file copied in the kernel: the store remembers
// verification only from this size up (cas/local.VerifyMin).
const kcopyMin = 1 << 20
