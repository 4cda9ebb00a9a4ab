package local

import (
	"io"
	"os"
	"syscall"

	"github.com/esf-dev/esf/cas"
)

// Verified objects. Get hashes every byte it serves, which bounds a copy of
// a large object by the hash (a few hundred MiB/s on one loaded core) where
// the kernel could copy, or share, its extents. So the store remembers, for
// large objects only, the file it last saw hash to the object's id: the
// identity of the file (device, inode, size, mtime, ctime) as seen after a
// Put of this process published it or when a Get opened it that then read
// it to a verified end. Any write, chmod or new name after that stat gives
// the file a later ctime, and so does unlinking a name of it (a batch's
// redo record), which only costs one more verification. (Linux 6.13+ on
// ext4, XFS, btrfs and tmpfs stamps a change that follows a stat of the
// file with a fine-grained time; on a file system with coarse timestamps a
// write in the same clock tick as the stat could go unseen, git's "racy"
// case.) OpenVerified hands out
// the object's file only while that identity still holds, so a file
// replaced, truncated or rewritten since is verified again (streamed through
// Get) before use. What a stat cannot see, a disk that silently flips a bit
// under an unchanged inode, stays for fsck to find, as it does for the FUSE
// passthrough, which reads objects raw too. The set lives in memory and
// starts empty at Open.

// VerifyMin is the smallest object whose verification the store remembers:
// below it the hash costs less than the extra open and stat.
const VerifyMin = 1 << 20

// maxVerified bounds the set; it is emptied when full (a forgotten object
// is only verified again).
const maxVerified = 1 << 14

type fileKey struct {
	dev, ino uint64
	size     int64
	mtimeNs  int64
	ctimeNs  int64
}

func keyOf(fi os.FileInfo) (fileKey, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.Mode().IsRegular() {
		return fileKey{}, false
	}
	return keyOfStat(st), true
}

func keyOfStat(st *syscall.Stat_t) fileKey {
	return fileKey{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano()}
}

// noteVerified records that the file fi describes, just hashed to id,
// holds id.
func (s *Store) noteVerified(id cas.ID, fi os.FileInfo) {
	if k, ok := keyOf(fi); ok {
		s.noteKey(id, k)
	}
}

// notePublished records object id, hashed as written into the file whose
// inode is ino, if Path(id) is that file now.
func (s *Store) notePublished(id cas.ID, ino uint64) {
	var st syscall.Stat_t
	if err := syscall.Lstat(s.Path(id), &st); err != nil || st.Ino != ino || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	s.noteKey(id, keyOfStat(&st))
}

func (s *Store) noteKey(id cas.ID, k fileKey) {
	if k.size < VerifyMin {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.verified == nil || len(s.verified) >= maxVerified {
		s.verified = map[cas.ID]fileKey{}
	}
	s.verified[id] = k
}

// OpenVerified opens the file of object id if the store has verified it (see
// above) and it has not changed since; otherwise it returns nil, and the
// caller reads the object through Get. The caller closes the file. Its bytes
// are the object's raw content: copy them in the kernel (copy_file_range),
// never write to them.
func (s *Store) OpenVerified(id cas.ID) *os.File {
	s.mu.Lock()
	want, ok := s.verified[id]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	f, err := os.Open(s.Path(id))
	if err != nil {
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil
	}
	if k, ok := keyOf(fi); !ok || k != want {
		f.Close()
		s.mu.Lock()
		if s.verified[id] == want {
			delete(s.verified, id)
		}
		s.mu.Unlock()
		return nil
	}
	return f
}

// verifiedEnd records a large object as verified when a Get has read it to
// a verified end (the verifying reader under it returned io.EOF).
type verifiedEnd struct {
	io.ReadCloser
	s    *Store
	id   cas.ID
	fi   os.FileInfo
	size int64
}

// ObjectSize tells cas.ReadAll (and ReadTreeViewUpTo) the object's size,
// which the verifying reader it wraps would tell of its file.
func (r *verifiedEnd) ObjectSize() int64 { return r.size }

func (r *verifiedEnd) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err == io.EOF && r.fi != nil {
		r.s.noteVerified(r.id, r.fi)
		r.fi = nil
	}
	return n, err
}
