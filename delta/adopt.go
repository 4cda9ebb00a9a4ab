package delta

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// A seal of an attempt that is released with it hands the large files of
// its upper directory to the content store instead of copying them (see
// ingest.Options.Adopt): each becomes read-only and shares its inode with
// the stored object. Should the seal not commit, the attempt goes on with
// this delta, which must then get its files back as they were: before each
// file is handed over, the seal notes its path and mode in the delta's
// adoption log (NoteAdopted), and the next mount of the delta gives every
// file the log names its own inode again (Unshare). The log is not synced:
// a delta is volatile, lost with the machine anyway, and a process that dies
// leaves its writes in the page cache.

func (l Layout) adoptLog() string { return filepath.Join(l.Dir, "adopted") }

type adoptRecord struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
	// UID and GID are the file's owner before the store made it its own;
	// absent in a record of an older esf, which left the owner.
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
}

// NoteAdopted appends the upper file rel, whose permission bits are mode
// and whose owner is uid:gid, to the delta's adoption log. It is safe for
// concurrent use: each record is one append.
func (l Layout) NoteAdopted(rel string, mode, uid, gid uint32) error {
	b, err := json.Marshal(adoptRecord{Path: rel, Mode: mode, UID: &uid, GID: &gid})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(l.adoptLog(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	return errors.Join(err, f.Close())
}

// Unshare gives every upper file the adoption log names its own inode
// owner and mode again, as they were before a seal handed it to the store,
// then removes the log. A file with one name only gets its owner and mode
// back; one that
// shares its inode is replaced by a copy with the same content, owner,
// mode, extended attributes and times. Call it before mounting the delta.
func (l Layout) Unshare() error {
	f, err := os.Open(l.adoptLog())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r adoptRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			break // a record torn by a crash: its file was not handed over yet
		}
		if !filepath.IsLocal(r.Path) {
			return fmt.Errorf("delta %s: adoption log names %q", l.Dir, r.Path)
		}
		if err := unshare(filepath.Join(l.Upper(), r.Path), r); err != nil {
			return fmt.Errorf("delta %s: give %s its own inode back: %w", l.Dir, r.Path, err)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return os.Remove(l.adoptLog())
}

func unshare(path string, r adoptRecord) error {
	mode := r.Mode
	src, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ELOOP) {
		return nil // gone, or not a file: nothing of the store's
	}
	if err != nil {
		return err
	}
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	// The store made the file its own (owner, group): the log has the
	// file's.
	if r.UID != nil && r.GID != nil {
		st.Uid, st.Gid = *r.UID, *r.GID
	}
	if st.Nlink == 1 {
		var cur unix.Stat_t
		if err := unix.Fstat(int(src.Fd()), &cur); err != nil {
			return err
		}
		if cur.Uid != st.Uid || cur.Gid != st.Gid {
			// Owner first: chown clears set-id bits.
			if err := unix.Fchown(int(src.Fd()), int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		} else if st.Mode&0o7777 == mode {
			return nil
		}
		return unix.Fchmod(int(src.Fd()), mode)
	}
	tmp := filepath.Join(filepath.Dir(path), ".esf-unshare-"+strconv.FormatUint(rand.Uint64(), 16))
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = copyFile(dst, src, &st, mode)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// copyFile copies src, whose fstat is st, into dst with its owner, mode
// (given: src's may have been changed), extended attributes and times.
func copyFile(dst, src *os.File, st *unix.Stat_t, mode uint32) error {
	if _, err := io.Copy(dst, src); err != nil {
		return err
	}
	fd := int(dst.Fd())
	// Owner first: chown clears set-id bits and file capabilities.
	if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return err
	}
	if err := copyXattrs(fd, int(src.Fd())); err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd),
		[]unix.Timespec{st.Atim, st.Mtim}, 0)
}

func copyXattrs(dst, src int) error {
	n, err := unix.Flistxattr(src, nil)
	if err != nil || n == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return err
	}
	names := make([]byte, n)
	if n, err = unix.Flistxattr(src, names); err != nil {
		return err
	}
	for _, name := range splitNames(names[:n]) {
		sz, err := unix.Fgetxattr(src, name, nil)
		if err != nil {
			return err
		}
		v := make([]byte, sz)
		if sz, err = unix.Fgetxattr(src, name, v); err != nil {
			return err
		}
		if err := unix.Fsetxattr(dst, name, v[:sz], 0); err != nil {
			return err
		}
	}
	return nil
}

func splitNames(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != 0 {
			i++
		}
		if i > 0 {
			out = append(out, string(b[:i]))
		}
		if i == len(b) {
			break
		}
		b = b[i+1:]
	}
	return out
}
