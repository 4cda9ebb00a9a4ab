// Command walker prints every path under a directory, one line each, so
// that what two backends see of one root can be compared (FR-07): the same
// source builds a static Linux binary (run under runc) and a wasip1 module
// (run under wazero), and their outputs are compared with each other and
// with the tree in the CAS (internal/walker/walkertest).
//
// Usage:
//
//	walker [-skip /proc,/sys,/dev,/.esf] [-portable] [-hash blake3|sha256] [ROOT]
//
// ROOT defaults to "/". Each line is six tab-separated fields:
//
//		PATH TYPE SIZE MODE TARGET HASH
//
//	  - PATH is relative to ROOT with a leading slash ("/" is ROOT itself), in
//	    Go's quoted form (strconv.Quote), so any byte survives. Lines are
//	    sorted by the unquoted path, bytewise.
//	  - TYPE is file, dir, symlink, chardev, blockdev, fifo, socket or other.
//	  - SIZE is the byte count of a file or the length of a symlink's target;
//	    "-" for other types (a directory's size is the file system's business).
//	  - MODE is the permission bits with setuid, setgid and sticky, in octal
//	    (%04o); "-" for symlinks (Linux ignores their mode) and under -portable.
//	  - TARGET is a symlink's target, quoted and verbatim; "-" otherwise.
//	  - HASH is the hex digest of a file's content, BLAKE3-256 by default
//	    (equal to the file's CAS id) or SHA-256; "-" otherwise.
//
// -skip lists paths (relative to ROOT, comma-separated) left out with
// everything below them, whether they exist or not: mounts a container
// gets and a WASI guest does not. -skip "" skips nothing.
//
// -portable prints only what WASI preview 1 can report, so a Linux run and
// a wasip1 run of one root print the same lines: no mode (WASI has no
// permission bits; Go on wasip1 invents 0600/0700), and fifo, socket and
// anything WASI calls "unknown" become "other". Owner, group, times, link
// counts and device numbers are never printed: WASI reports none of them
// but times and link counts, and those differ between file systems
// (overlayfs copy-up, FUSE) for reasons FR-07 is not about. A wasip1 build
// is always portable.
//
// Errors (an unreadable directory, a vanished file) end the walk with exit
// code 1 and a message on stderr: a partial listing must not compare equal.
//
// It uses only the standard library and github.com/zeebo/blake3 (pure Go
// on wasm), so it builds for GOOS=wasip1.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/zeebo/blake3"
)

type options struct {
	root     string
	skip     []string
	portable bool
	newHash  func() hash.Hash
}

type line struct{ path, text string }

func main() {
	fl := flag.NewFlagSet("walker", flag.ContinueOnError)
	skip := fl.String("skip", "/proc,/sys,/dev,/.esf", "comma-separated paths to leave out, relative to ROOT")
	portable := fl.Bool("portable", false, "print only what WASI can report")
	hashName := fl.String("hash", "blake3", "content hash: blake3 or sha256")
	if err := fl.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	o := options{root: "/", portable: *portable || runtime.GOOS == "wasip1"}
	switch fl.NArg() {
	case 0:
	case 1:
		o.root = fl.Arg(0)
	default:
		fatal(fmt.Errorf("want at most one ROOT, got %q", fl.Args()))
	}
	for _, s := range strings.Split(*skip, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.skip = append(o.skip, path.Clean("/"+s))
		}
	}
	switch *hashName {
	case "blake3":
		o.newHash = func() hash.Hash { return blake3.New() }
	case "sha256":
		o.newHash = sha256.New
	default:
		fatal(fmt.Errorf("unknown hash %q", *hashName))
	}

	var lines []line
	if err := walk(o, "/", func(l line) { lines = append(lines, l) }); err != nil {
		fatal(err)
	}
	slices.SortFunc(lines, func(a, b line) int { return strings.Compare(a.path, b.path) })
	out := make([]byte, 0, 128*len(lines))
	for _, l := range lines {
		out = append(out, l.text...)
	}
	if _, err := os.Stdout.Write(out); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "walker:", err)
	os.Exit(1)
}

func (o options) skipped(rel string) bool {
	for _, s := range o.skip {
		if rel == s || strings.HasPrefix(rel, s+"/") || s == "/" {
			return true
		}
	}
	return false
}

// walk emits rel (a path relative to the root, with a leading slash) and,
// for a directory, everything below it.
func walk(o options, rel string, emit func(line)) error {
	if o.skipped(rel) {
		return nil
	}
	host := path.Join(o.root, rel)
	var fi fs.FileInfo
	var err error
	if rel == "/" {
		fi, err = os.Stat(host) // ROOT itself may be given as a symlink
	} else {
		fi, err = os.Lstat(host)
	}
	if err != nil {
		return err
	}
	l, err := describe(o, host, rel, fi)
	if err != nil {
		return err
	}
	emit(l)
	if !fi.IsDir() {
		return nil
	}
	entries, err := os.ReadDir(host)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := walk(o, path.Join(rel, e.Name()), emit); err != nil {
			return err
		}
	}
	return nil
}

func describe(o options, host, rel string, fi fs.FileInfo) (line, error) {
	typ := kind(fi)
	size, mode, target, sum := "-", "-", "-", "-"
	if typ != "symlink" && !o.portable {
		mode = fmt.Sprintf("%04o", unixMode(fi.Mode()))
	}
	switch typ {
	case "file":
		size = strconv.FormatInt(fi.Size(), 10)
		h, err := hashFile(o, host)
		if err != nil {
			return line{}, err
		}
		sum = h
	case "symlink":
		t, err := os.Readlink(host)
		if err != nil {
			return line{}, err
		}
		size, target = strconv.Itoa(len(t)), strconv.Quote(t)
	case "fifo", "socket":
		if o.portable {
			typ = "other"
		}
	}
	text := strings.Join([]string{strconv.Quote(rel), typ, size, mode, target, sum}, "\t") + "\n"
	return line{path: rel, text: text}, nil
}

// kind names a file's type. On wasip1 a type WASI calls unknown (a FIFO or
// socket) arrives with no type bits, like a regular file, and kindOther
// tells them apart.
func kind(fi fs.FileInfo) string {
	switch t := fi.Mode().Type(); {
	case t == 0:
		if kindOther(fi) {
			return "other"
		}
		return "file"
	case t&fs.ModeDir != 0:
		return "dir"
	case t&fs.ModeSymlink != 0:
		return "symlink"
	case t&fs.ModeCharDevice != 0:
		return "chardev"
	case t&fs.ModeDevice != 0:
		return "blockdev"
	case t&fs.ModeNamedPipe != 0:
		return "fifo"
	case t&fs.ModeSocket != 0:
		return "socket"
	default:
		return "other"
	}
}

func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

func hashFile(o options, name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := o.newHash()
	if _, err := io.CopyBuffer(h, f, make([]byte, 1<<20)); err != nil {
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
