package fusefs

import (
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Handle-based operations on a directory the kernel opened without the
// server (handle 0): fsync, lseek, POSIX locks and flock behave as on a
// read-only disk file system.
func TestHandlelessDirHandleOps(t *testing.T) {
	st := newCountingStore()
	root, _ := buildDirs(t, st, 1, 10, false)
	f, mnt := mount(t, st, root)
	dir := filepath.Join(mnt, "d00", "sub")
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := readNames(fd, 4096, -1); err != nil {
		t.Fatal(err)
	}
	kernelHasNoOpendir(t, f)
	if err := unix.Fsync(fd); err != nil {
		t.Errorf("fsync: %v", err)
	}
	if err := unix.Fdatasync(fd); err != nil {
		t.Errorf("fdatasync: %v", err)
	}
	if _, err := unix.Seek(fd, 3, 0); err != nil {
		t.Errorf("lseek: %v", err)
	}
	if names, err := readNames(fd, 4096, -1); err != nil || len(names) != 7 {
		t.Errorf("after lseek to 3: %d names (%v), want 7", len(names), err)
	}
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk); err != nil {
		t.Errorf("F_GETLK: %v", err)
	} else if lk.Type != unix.F_UNLCK {
		t.Errorf("F_GETLK: type %d, want unlocked", lk.Type)
	}
	lk = unix.Flock_t{Type: unix.F_RDLCK, Whence: 0}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk); err != nil {
		t.Errorf("F_SETLK: %v", err)
	}
	if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
		t.Errorf("flock: %v", err)
	}
	if err := unix.Flock(fd, unix.LOCK_UN); err != nil {
		t.Errorf("flock unlock: %v", err)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		t.Errorf("fstatfs: %v", err)
	}
	// And fsync of a file: the projection is read-only, there is nothing
	// to sync, and a disk file system opened read-only says so with 0.
	ffd, err := unix.Open(filepath.Join(dir, "f00001"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ffd)
	if err := unix.Fsync(ffd); err != nil {
		t.Errorf("fsync of a file: %v", err)
	}
	// The server still answers.
	if _, err := listSmall(dir, true); err != nil {
		t.Errorf("list after: %v", err)
	}
}
