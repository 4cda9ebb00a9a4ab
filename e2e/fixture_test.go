package e2e

import (
	"bytes"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/internal/testenv"
	"golang.org/x/sys/unix"
)

// Files of the fixture whose content tests look up.
const (
	fixtureReadme = "docs/readme.txt"
	fixtureBig    = "data/big.bin"
)

var readmeContent = []byte("esf end-to-end fixture\n" + string(bytes.Repeat([]byte("line of text\n"), 400)))

var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixtureErr  error
)

// fixture returns a directory (shared by the tests, never modified) with
// every kind of entry an import must reproduce: nested and empty dirs,
// empty files, a large file, symlinks (relative, absolute, dangling), hard
// links, exec/setuid/setgid/sticky bits, foreign ownership, xattrs (user.*
// and trusted.*, on a symlink too), a fifo, a device node and nanosecond
// mtimes.
func fixture(t *testing.T) string {
	t.Helper()
	requireRoot(t)
	fixtureOnce.Do(func() {
		fixtureDir = filepath.Join(workDir, "fixture")
		fixtureErr = writeFixture(fixtureDir, bigSize())
	})
	if fixtureErr != nil {
		t.Fatalf("fixture: %v", fixtureErr)
	}
	return fixtureDir
}

func bigSize() int64 {
	if testing.Short() {
		return 8 << 20
	}
	return 100 << 20
}

func writeFixture(root string, big int64) error {
	type step func() error
	p := func(rel string) string { return filepath.Join(root, rel) }
	file := func(rel string, data []byte, mode os.FileMode) step {
		return func() error {
			if err := os.WriteFile(p(rel), data, 0o600); err != nil {
				return err
			}
			return os.Chmod(p(rel), mode) // WriteFile's mode is filtered by the umask
		}
	}
	dir := func(rel string, mode os.FileMode) step {
		return func() error {
			if err := os.MkdirAll(p(rel), 0o755); err != nil {
				return err
			}
			return os.Chmod(p(rel), mode)
		}
	}
	chown := func(rel string, uid, gid int) step {
		return func() error { return os.Lchown(p(rel), uid, gid) }
	}
	xattr := func(rel, name, value string) step {
		return func() error { return unix.Lsetxattr(p(rel), name, []byte(value), 0) }
	}
	steps := []step{
		dir("", 0o755),
		dir("docs", 0o755),
		dir("a/b/c/d", 0o755),
		dir("empty-dir", 0o700),
		dir("shared", 0o1777),     // sticky
		dir("setgid-dir", 0o2775), // setgid
		dir("data", 0o755),
		file(fixtureReadme, readmeContent, 0o644),
		file("a/b/c/d/deep.txt", []byte("deep\n"), 0o600),
		file("empty", nil, 0o644),
		file("a/empty2", nil, 0o400),
		file("bin/tool", []byte("#!/bin/sh\necho tool\n"), 0o755),
		file("setuid-tool", []byte("#!/bin/sh\nid\n"), 0o644),
		file("owned", []byte("not root's\n"), 0o640),
		func() error { return writeBig(p(fixtureBig), big) },
		func() error { return os.Symlink("../docs/readme.txt", p("a/rel-link")) },
		func() error { return os.Symlink("/etc/passwd", p("abs-link")) },
		func() error { return os.Symlink("no/such/target", p("dangling")) },
		func() error { return os.Link(p("bin/tool"), p("a/b/tool-hardlink")) },
		func() error { return os.Link(p("bin/tool"), p("tool-hardlink2")) },
		func() error { return unix.Mkfifo(p("fifo"), 0o620) },
		func() error { return unix.Mknod(p("null-dev"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))) },
		chown("owned", 1234, 5678),
		chown("a/b/c", 4321, 8765),
		chown("dangling", 99, 98),
		// chown clears setuid, so the bits come after the owner.
		func() error { return os.Chown(p("setuid-tool"), 0, 0) },
		func() error { return os.Chmod(p("setuid-tool"), 0o4755) },
		xattr(fixtureReadme, "user.mime_type", "text/plain"),
		xattr(fixtureReadme, "user.empty", ""),
		xattr("a", "user.note", "a directory xattr"),
		xattr("bin/tool", "trusted.esf.test", "\x00binary\xff"),
		xattr("abs-link", "trusted.link", "on a symlink"),
	}
	// bin/ does not exist before its file.
	if err := os.MkdirAll(p("bin"), 0o755); err != nil {
		return err
	}
	for i, s := range steps {
		if err := s(); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	// Distinct nanosecond mtimes, set children first so that nothing bumps
	// a directory's mtime afterwards.
	var paths []string
	if err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		paths = append(paths, path)
		return err
	}); err != nil {
		return err
	}
	sort.Sort(sort.Reverse(sort.StringSlice(paths)))
	base := time.Date(2024, 2, 29, 12, 0, 0, 0, time.UTC).UnixNano()
	for i, path := range paths {
		ts := unix.NsecToTimespec(base + int64(i)*1_000_000_007)
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	return nil
}

// writeBig writes size pseudo-random (incompressible, undeduplicable)
// bytes, quickly.
func writeBig(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	rng := rand.NewChaCha8([32]byte{'e', 's', 'f'})
	buf := make([]byte, 1<<20)
	for left := size; left > 0; {
		n := min(left, int64(len(buf)))
		rng.Read(buf[:n])
		if _, err := f.Write(buf[:n]); err != nil {
			return err
		}
		left -= n
	}
	return f.Close()
}

// meta is what stat and getfattr show of one entry.
type meta struct {
	Mode   fs.FileMode
	UID    uint32
	GID    uint32
	Size   int64 // regular files
	Mtime  int64
	Rdev   uint64
	Target string
	Nlink  uint64
	Link   string // first path (walk order) sharing the inode, for hard links
	Xattrs string
}

// scanTree lists the metadata of every entry under root, by relative path.
func scanTree(t *testing.T, root string) map[string]meta {
	t.Helper()
	out := map[string]meta{}
	firstOf := map[uint64]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		m := meta{
			Mode:  fi.Mode(),
			UID:   st.Uid,
			GID:   st.Gid,
			Mtime: st.Mtim.Nano(),
			Nlink: uint64(st.Nlink),
		}
		switch {
		case fi.Mode().IsRegular():
			m.Size = st.Size
			if first, ok := firstOf[st.Ino]; ok {
				m.Link = first
			} else {
				firstOf[st.Ino] = rel
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			if m.Target, err = os.Readlink(path); err != nil {
				return err
			}
		case fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice) != 0:
			m.Rdev = uint64(st.Rdev)
		}
		if fi.IsDir() {
			m.Nlink = 0 // counts subdirectories; the tree does not record it
		}
		m.Xattrs, err = xattrs(path)
		if err != nil {
			return err
		}
		out[rel] = m
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func xattrs(path string) (string, error) {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(path, buf)
	if err != nil {
		return "", err
	}
	var names []string
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		if len(name) > 0 {
			names = append(names, string(name))
		}
	}
	sort.Strings(names)
	var sb bytes.Buffer
	for _, name := range names {
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(path, name, v)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&sb, "%s=%q;", name, v[:m])
	}
	return sb.String(), nil
}

// compareTrees fails t unless got reproduces want: diff -r of contents,
// then stat-level metadata and xattrs of every entry, then getfattr.
func compareTrees(t *testing.T, want, got string) {
	t.Helper()
	// diff cannot compare fifos and devices; their metadata is checked below.
	diff := exec.Command("diff", "-r", "--no-dereference", "-x", "fifo", "-x", "null-dev", want, got)
	if out, err := diff.CombinedOutput(); err != nil {
		t.Errorf("diff -r %s %s: %v\n%s", want, got, err, out)
	}
	w, g := scanTree(t, want), scanTree(t, got)
	for path, wm := range w {
		gm, ok := g[path]
		if !ok {
			t.Errorf("%s: missing", path)
			continue
		}
		if wm != gm {
			t.Errorf("%s:\n got  %+v\n want %+v", path, gm, wm)
		}
	}
	for path := range g {
		if _, ok := w[path]; !ok {
			t.Errorf("%s: not in the source", path)
		}
	}
	if testenv.Has(t, "cmd:getfattr") { // CI: required (scripts/deps.sh installs attr)
		dump := func(dir string) string {
			cmd := exec.Command("getfattr", "-R", "-h", "-d", "-m", "-", "-e", "hex", ".")
			cmd.Dir = dir
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("getfattr in %s: %v", dir, err)
			}
			// One block per file, in readdir order: sort them.
			blocks := strings.Split(strings.TrimSpace(string(out)), "\n\n")
			sort.Strings(blocks)
			return strings.Join(blocks, "\n\n")
		}
		if a, b := dump(want), dump(got); a != b {
			t.Errorf("getfattr differs:\n--- %s\n%s\n--- %s\n%s", want, a, got, b)
		}
	}
}
