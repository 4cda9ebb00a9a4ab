package local

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// ReadSmall reads object id, which its tree says holds size bytes, whole
// into buf and returns buf[:size] once those bytes hash to id. buf must be
// longer than size (the extra byte shows a file that is longer than the
// tree says). It is Get for a caller that knows the size and wants the
// bytes in memory: one open, read and close of the object's file, the
// hash over the bytes in one pass, no reader, hasher or buffer allocated
// per object, which is most of the cost of exporting a small file.
//
// Errors: cas.ErrNotFound when the store has no file for id; cas.ErrCorrupt
// when the file holds other than size bytes or they do not hash to id (as
// Get's reader would report at its end); cas.ErrInvalidArgument when buf
// has no room for size+1 bytes.
func (s *Store) ReadSmall(id cas.ID, size int64, buf []byte) ([]byte, error) {
	if size < 0 || int64(len(buf)) <= size {
		return nil, fmt.Errorf("read %s: %d bytes into a buffer of %d: %w", id, size, len(buf), cas.ErrInvalidArgument)
	}
	fd, err := openRetry(s.Path(id))
	if err != nil {
		return nil, objectError("read", id, err)
	}
	buf = buf[:size+1]
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("read %s: %w", id, err)
		}
		if m == 0 {
			break
		}
		n += m
	}
	unix.Close(fd)
	if int64(n) > size {
		return nil, fmt.Errorf("object %s: longer than the %d bytes its tree says: %w", id, size, cas.ErrCorrupt)
	}
	if int64(n) < size {
		return nil, fmt.Errorf("object %s: %d bytes, its tree says %d: %w", id, n, size, cas.ErrCorrupt)
	}
	if cas.Sum(buf[:n]) != id {
		return nil, fmt.Errorf("object %s: content does not match its id: %w", id, cas.ErrCorrupt)
	}
	return buf[:n], nil
}

// openRetry opens path read-only, retrying an open an interrupt cut short
// (os.Open does the same).
func openRetry(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}
