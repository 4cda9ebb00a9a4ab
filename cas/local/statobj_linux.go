//go:build linux

package local

import (
	"encoding/hex"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// objectsDir is the objects directory held open (O_PATH) so that Stat
// resolves "ab/<rest>" below it: two path components instead of the
// store's whole absolute path, with no path string built on the heap but
// the name. Stat is the per-file cost of a re-import the stat cache
// serves (ingest.StatCache asks Has of every unchanged file), and a walk
// of the long absolute path cost twice the source's own lstat there.
type objectsDir struct {
	f  *os.File
	rc syscall.RawConn
}

func openObjectsDir(dir string) *objectsDir {
	f, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	return &objectsDir{f: f, rc: rc}
}

func (d *objectsDir) close() {
	if d != nil {
		d.f.Close()
	}
}

// statObject returns the size of id's file. ok is false where the
// directory is not open (or closed meanwhile): the caller then stats by
// path. Control holds the descriptor, so a concurrent Close cannot free
// it under the fstatat.
func (d *objectsDir) statObject(id cas.ID) (size int64, ok bool, err error) {
	if d == nil {
		return 0, false, nil
	}
	var name [2*len(cas.ID{}) + 1]byte
	hex.Encode(name[:2], id[:1])
	name[2] = '/'
	hex.Encode(name[3:], id[1:])
	var st unix.Stat_t
	cerr := d.rc.Control(func(fd uintptr) {
		err = unix.Fstatat(int(fd), string(name[:]), &st, unix.AT_SYMLINK_NOFOLLOW)
	})
	if cerr != nil {
		return 0, false, nil
	}
	if err != nil {
		return 0, true, &fs.PathError{Op: "lstat", Path: string(name[:]), Err: err}
	}
	return st.Size, true, nil
}
