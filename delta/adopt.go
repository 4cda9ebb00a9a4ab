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
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// A seal of an attempt that is released with it hands the large files of
// its upper directory to the content store instead of copying them (see
// ingest.Options.Adopt): each becomes the store's, read-only, and shares
// its inode with the stored object. Should the seal not commit, the
// attempt goes on with this delta, which must then get its files back as
// they were: before each file is handed over, the seal notes its path,
// mode, owner and the extended attributes the handover clears (a file
// capability: the store's chown drops it) in the delta's adoption log
// (NoteAdopted), and the next mount of the delta gives every file the log
// names its own inode, owner, mode and those attributes again (Unshare).
//
// The log is not synced, and needs no sync for the crash contract. A
// process that dies leaves its appends in the page cache, where the next
// mount reads them. Only a crash of the machine can lose them, and then
// the delta is lost anyway: it is mounted volatile, and fabric refuses to
// mount one again under another boot (the attempt's recorded BootID), so
// no upper directory whose log a machine crash could have torn is ever
// mounted. A record torn by a process crash mid-append names a file that
// was not handed over yet (Unshare stops at it).

func (l Layout) adoptLog() string { return filepath.Join(l.Dir, "adopted") }

type adoptRecord struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
	// UID and GID are the file's owner before the store made it its own;
	// absent in a record of an older esf, which left the owner.
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	// Xattrs are the file's extended attributes that the handover clears
	// (clearedByHandover); absent in a record of an older esf.
	Xattrs []cas.Xattr `json:"xattrs,omitempty"`
}

// clearedByHandover names the extended attributes that handing a file to
// the store takes away: the store's chown of it clears its capability.
// Every other one stays on the inode (and an unshared copy gets it).
var clearedByHandover = []string{"security.capability"}

// NoteAdopted appends the upper file rel, whose permission bits are mode,
// whose owner is uid:gid and whose extended attributes are xattrs, to the
// delta's adoption log. It is safe for concurrent use: each record is one
// append.
func (l Layout) NoteAdopted(rel string, mode, uid, gid uint32, xattrs []cas.Xattr) error {
	r := adoptRecord{Path: rel, Mode: mode, UID: &uid, GID: &gid}
	for _, x := range xattrs {
		if slices.Contains(clearedByHandover, x.Name) {
			r.Xattrs = append(r.Xattrs, x)
		}
	}
	b, err := json.Marshal(r)
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

// Unshare gives every upper file the adoption log names its own inode,
// owner, mode and extended attributes again, as they were before a seal
// handed it to the store, then removes the log. A file with one name only
// gets its owner, mode and the attributes the log holds back; one that
// shares its inode is replaced by a copy with the same content, owner,
// mode, extended attributes (the inode's and the log's) and times. Call it
// before mounting the delta.
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
	if st.Nlink == 1 {
		fd := int(src.Fd())
		// The store made the file its own (owner, group): the log has the
		// file's.
		if r.UID != nil && r.GID != nil && (st.Uid != *r.UID || st.Gid != *r.GID) {
			// Owner first: chown clears set-id bits and the capability.
			if err := unix.Fchown(fd, int(*r.UID), int(*r.GID)); err != nil {
				return err
			}
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return err
		}
		return setXattrs(fd, r.Xattrs)
	}
	if r.UID != nil && r.GID != nil {
		st.Uid, st.Gid = *r.UID, *r.GID
	}
	tmp := filepath.Join(filepath.Dir(path), ".esf-unshare-"+strconv.FormatUint(rand.Uint64(), 16))
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = copyFile(dst, src, &st, mode, r.Xattrs)
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
// (given: src's may have been changed), extended attributes (src's, then
// xattrs, which src lost) and times.
func copyFile(dst, src *os.File, st *unix.Stat_t, mode uint32, xattrs []cas.Xattr) error {
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
	if err := setXattrs(fd, xattrs); err != nil {
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

// setXattrs sets every extended attribute of xs on fd (after its owner:
// a chown would clear a capability set before it).
func setXattrs(fd int, xs []cas.Xattr) error {
	for _, x := range xs {
		if err := unix.Fsetxattr(fd, x.Name, x.Value, 0); err != nil {
			return fmt.Errorf("set %s: %w", x.Name, err)
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
