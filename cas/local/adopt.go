//go:build linux

package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

var _ cas.Adopter = (*batch)(nil)

// Adopt implements cas.Adopter for the batch: the file's inode becomes
// the object, so a large file that its owner hands over (a released
// attempt's upper file) is hashed once and never copied.
//
// It hashes what r reads, checks that f did not change meanwhile (same
// inode, size, mtime and ctime before and after, and the size hashed),
// makes f the store's (owner and group: the process's) and read-only, and hard-links it by descriptor as the object's temp
// file, tmp/pub-<id>-...: from there on it is an object of the batch like
// any other, made durable by Commit's syncfs (which writes back whatever of
// the file is still dirty) and linked into place with the same redo record.
// An object already stored or in the batch is left alone and f is not
// touched. A file another descriptor has open (checked with a write lease
// before the hash and again after the link) is copied instead. Where f
// cannot be linked (another file system: EXDEV), its
// content is copied as Put does, and its owner and mode put back.
func (b *batch) Adopt(ctx context.Context, f *os.File, r io.Reader) (cas.Info, bool, error) {
	if err := b.start(); err != nil {
		return cas.Info{}, false, err
	}
	fd := int(f.Fd())
	var before unix.Stat_t
	if err := unix.Fstat(fd, &before); err != nil {
		return cas.Info{}, false, fmt.Errorf("batch adopt %s: %w", f.Name(), err)
	}
	if before.Mode&unix.S_IFMT != unix.S_IFREG {
		return cas.Info{}, false, fmt.Errorf("batch adopt %s: not a regular file: %w", f.Name(), cas.ErrInvalidArgument)
	}
	// No one else may have the file open: a writer that reached it
	// through another mount of the same overlay (a bind mount, a mount
	// namespace's copy) survives the attempt's unmount and would change
	// the object after it was hashed. Such a file is copied as Put does.
	if !alone(fd) {
		return b.Put(ctx, r)
	}
	bp := bufPool.Get().(*[]byte)
	h := cas.NewHasher()
	size, err := io.CopyBuffer(h, r, *bp)
	bufPool.Put(bp)
	if err != nil {
		return cas.Info{}, false, fmt.Errorf("batch adopt: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return cas.Info{}, false, fmt.Errorf("batch adopt: %w", err)
	}
	info := cas.Info{ID: cas.IDFromHash(h), Size: size}
	var after unix.Stat_t
	if err := unix.Fstat(fd, &after); err != nil {
		return cas.Info{}, false, fmt.Errorf("batch adopt %s: %w", f.Name(), err)
	}
	if after.Ino != before.Ino || after.Dev != before.Dev || after.Size != size || after.Size != before.Size ||
		after.Mtim != before.Mtim || after.Ctim != before.Ctim {
		return cas.Info{}, false, fmt.Errorf("batch adopt %s: the file changed while it was hashed: %w", f.Name(), cas.ErrFailedPrecondition)
	}
	if known, err := b.known(info.ID); err != nil || known {
		return info, false, err
	}

	seq := b.seq.Add(1)
	pub := b.pubPath(info.ID, seq)
	// The store's, like every object, before it has a name there: the
	// store's directories are searchable by all, so an owner kept from the
	// file's writer could make the object writable again and change it
	// under every tree that shares it. The chown also clears set-id bits
	// and file capabilities.
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	if before.Uid != uid || before.Gid != gid {
		if err := unix.Fchown(fd, int(uid), int(gid)); err != nil {
			return cas.Info{}, false, fmt.Errorf("batch adopt %s: %w", f.Name(), err)
		}
	}
	// Read-only before it has a name in the store, like every object.
	if err := unix.Fchmod(fd, 0o444); err != nil {
		unix.Fchown(fd, int(before.Uid), int(before.Gid))
		unix.Fchmod(fd, before.Mode&0o7777)
		return cas.Info{}, false, fmt.Errorf("batch adopt %s: %w", f.Name(), err)
	}
	if err := linkFD(fd, pub); err != nil {
		unix.Fchown(fd, int(before.Uid), int(before.Gid))
		unix.Fchmod(fd, before.Mode&0o7777)
		if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EOPNOTSUPP) {
			return cas.Info{}, false, fmt.Errorf("batch adopt %s: %w", f.Name(), err)
		}
		// Not linkable here: store a copy.
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return cas.Info{}, false, fmt.Errorf("batch adopt %s: %w", f.Name(), err)
		}
		got, created, err := b.Put(ctx, f)
		if err == nil && got.ID != info.ID {
			err = fmt.Errorf("batch adopt %s: the file changed while it was copied: %w", f.Name(), cas.ErrFailedPrecondition)
		}
		return got, created, err
	}

	// Opened meanwhile (before the chown and chmod made that the
	// store's privilege), or written by a descriptor closed since: put
	// the file back and copy it.
	var linked unix.Stat_t
	if !alone(fd) || unix.Fstat(fd, &linked) != nil || linked.Mtim != after.Mtim || linked.Size != after.Size {
		os.Remove(pub)
		unix.Fchown(fd, int(before.Uid), int(before.Gid))
		unix.Fchmod(fd, before.Mode&0o7777)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return cas.Info{}, false, fmt.Errorf("batch adopt %s: %w", f.Name(), err)
		}
		return b.Put(ctx, f)
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		os.Remove(pub)
		return cas.Info{}, false, errEnded("adopt")
	}
	if _, dup := b.objs[info.ID]; dup {
		os.Remove(pub)
		return info, false, nil // a concurrent Put of the same bytes won
	}
	b.closeOpenLocked() // the file is flushed by syncfs, not by its own fsync
	b.objs[info.ID] = seq
	b.logLocked(info.ID, nil, false)
	if size >= VerifyMin {
		if b.large == nil {
			b.large = map[cas.ID]uint64{}
		}
		b.large[info.ID] = after.Ino
	}
	return info, true, nil
}

// linkFD gives the open file fd the new name path, without a path to it
// that a rename could change under us.
func linkFD(fd int, path string) error {
	err := unix.Linkat(fd, "", unix.AT_FDCWD, path, unix.AT_EMPTY_PATH)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) {
		// AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the magic link does not.
		err = unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, path, unix.AT_SYMLINK_FOLLOW)
	}
	if err != nil {
		return &os.LinkError{Op: "link", Old: f2s(fd), New: path, Err: err}
	}
	return nil
}

func f2s(fd int) string { return fmt.Sprintf("fd %d", fd) }

// alone reports whether fd is the only descriptor open on its file: a
// write lease is granted only then (it is released at once).
func alone(fd int) bool {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		return false
	}
	unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
	return true
}
