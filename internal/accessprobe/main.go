// Command accessprobe reports what the user it runs as may do with each
// path named on its command line, as JSON on stdout: for every path the
// errno (0 when allowed) of access(2) for R_OK, W_OK and X_OK, of
// actually reading it (a regular file: open and read one byte; a
// directory: list it; anything else: 0), and the extended attributes it
// may list, each with the errno of reading its value (trusted.* is
// root's alone). The kernel decides every answer
// (mode bits, POSIX ACLs, read-only mounts), so two trees that should
// behave alike must get the same answers.
//
// Tests start it under other uids and gids (exec.Cmd's
// SysProcAttr.Credential) to compare permission behaviour: it is a small
// static program, quick to start many times, unlike a test binary.
package main

import (
	"encoding/json"
	"errors"
	"os"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// access is one path's answers; tests decode it into a struct with the
// same fields.
type access struct {
	R, W, X, Read syscall.Errno
	Xattrs        string // "name=errno" for each name llistxattr gives, sorted
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	if err != nil {
		return syscall.EIO
	}
	return 0
}

func probe(p string) access {
	var a access
	a.R = errnoOf(unix.Faccessat(unix.AT_FDCWD, p, unix.R_OK, 0))
	a.W = errnoOf(unix.Faccessat(unix.AT_FDCWD, p, unix.W_OK, 0))
	a.X = errnoOf(unix.Faccessat(unix.AT_FDCWD, p, unix.X_OK, 0))
	a.Xattrs = xattrs(p)
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		a.Read = errnoOf(err)
		return a
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			_, err = unix.Read(fd, make([]byte, 1))
			unix.Close(fd)
		}
		a.Read = errnoOf(err)
	case unix.S_IFDIR:
		_, err := os.ReadDir(p)
		a.Read = errnoOf(err)
	}
	return a
}

// xattrs lists the names of p's extended attributes that the caller may
// list, sorted, each with the errno of reading its value; or the errno of
// listing them.
func xattrs(p string) string {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		return "list=" + unix.ErrnoName(errnoOf(err))
	}
	names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
	sort.Strings(names)
	var out []string
	for _, name := range names {
		if name == "" {
			continue
		}
		_, err := unix.Lgetxattr(p, name, make([]byte, 64<<10))
		e := "ok"
		if err != nil {
			e = unix.ErrnoName(errnoOf(err))
		}
		out = append(out, name+"="+e)
	}
	return strings.Join(out, " ")
}

func main() {
	out := map[string]access{}
	for _, p := range os.Args[1:] {
		out[p] = probe(p)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
