package local

import "golang.org/x/sys/unix"

// startWriteback asks the kernel to start writing [off, off+n) of fd to
// disk without waiting for it. Its errors are ignored on purpose: a failed
// writeback is recorded against the file and the filesystem and reported by
// the fsync or syncfs that must follow anyway, whereas the flags that wait
// (SYNC_FILE_RANGE_WAIT_*) would consume the file's error before that fsync
// saw it.
func startWriteback(fd int, off, n int64) {
	_ = unix.SyncFileRange(fd, off, n, unix.SYNC_FILE_RANGE_WRITE)
}
