package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/fabric"
)

// Sizes of the datasets. A "large" tree is 100k files (5k in quick mode),
// the big file 1 GiB (256 MiB).
func (e *Env) LargeTree() int { return e.Size(5_000, 100_000) }

// BigSize is the size of the big file.
func (e *Env) BigSize() int64 { return int64(e.Size(256, 1024)) << 20 }

// smallFileMax bounds the small files' sizes: uniform in [0, 4 KiB], a
// source tree's typical file.
const smallFileMax = 4096

// Tree returns a directory of n small files of seeded random content,
// created on first use: 100 files per directory, 32 directories per
// parent (p000/d00/f00.txt), so a change deep in it rewrites three trees.
func (e *Env) Tree(ctx context.Context, n int) (string, error) {
	if d, ok := e.trees[n]; ok {
		return d, nil
	}
	dir := filepath.Join(e.Dir, "src", fmt.Sprintf("tree-%d", n))
	e.logf("  generating %d files in %s", n, dir)
	if _, err := writeTree(ctx, dir, n, uint64(n)); err != nil {
		return "", err
	}
	e.trees[n] = dir
	return dir, nil
}

// TreePaths lists the files of a tree made by Tree, relative to it.
func TreePaths(n int) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = treePath(i)
	}
	return out
}

func treePath(i int) string {
	d := i / 100
	return fmt.Sprintf("p%03d/d%02d/f%02d.txt", d/32, d%32, i%100)
}

// Big returns a directory holding one file, big.bin, of BigSize random
// bytes, created on first use.
func (e *Env) Big(ctx context.Context) (string, error) {
	if e.big != "" {
		return e.big, nil
	}
	dir := filepath.Join(e.Dir, "src", "big")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	e.logf("  generating %d MiB in %s", e.BigSize()>>20, dir)
	if err := writeRandomFile(filepath.Join(dir, "big.bin"), e.BigSize(), 1); err != nil {
		return "", err
	}
	if err := syncfs(dir); err != nil {
		return "", err
	}
	e.big = dir
	return dir, nil
}

// Root imports dir into the main daemon once and returns its root id.
func (e *Env) Root(ctx context.Context, dir string) (string, error) {
	if id, ok := e.roots[dir]; ok {
		return id, nil
	}
	d, err := e.Main(ctx)
	if err != nil {
		return "", err
	}
	r, err := d.Ops.Import(ctx, dir)
	if err != nil {
		return "", err
	}
	e.roots[dir] = r.RootID
	return r.RootID, nil
}

// Group returns a group of the main daemon whose root node holds dir,
// created on first use.
func (e *Env) Group(ctx context.Context, dir string) (fabric.CreateGroupResult, error) {
	if g, ok := e.groups[dir]; ok {
		return g, nil
	}
	root, err := e.Root(ctx, dir)
	if err != nil {
		return fabric.CreateGroupResult{}, err
	}
	d, _ := e.Main(ctx)
	g, err := d.Ops.CreateGroup(ctx, root)
	if err != nil {
		return g, err
	}
	e.groups[dir] = g
	return g, nil
}

func newRand(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	copy(s[8:], "esf-bench-dataset-seed")
	return rand.NewChaCha8(s)
}

// writeRandomFile writes size pseudo-random (incompressible, seed-unique)
// bytes to a new file at path.
func writeRandomFile(path string, size int64, seed uint64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	rng := newRand(seed)
	buf := make([]byte, 1<<20)
	for left := size; left > 0; {
		n := int(min(left, int64(len(buf))))
		rng.Read(buf[:n])
		if _, err := f.Write(buf[:n]); err != nil {
			f.Close()
			return err
		}
		left -= int64(n)
	}
	return f.Close()
}

// writeTree creates n files under dir (see Env.Tree) and returns their
// total size.
func writeTree(ctx context.Context, dir string, n int, seed uint64) (int64, error) {
	rng := newRand(seed)
	sizes := rand.New(rng)
	buf := make([]byte, smallFileMax)
	var total int64
	lastDir := ""
	for i := range n {
		if i%1000 == 0 && ctx.Err() != nil {
			return total, ctx.Err()
		}
		p := filepath.Join(dir, treePath(i))
		if d := filepath.Dir(p); d != lastDir {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return total, err
			}
			lastDir = d
		}
		sz := sizes.IntN(smallFileMax + 1)
		rng.Read(buf[:sz])
		if err := os.WriteFile(p, buf[:sz], 0o644); err != nil {
			return total, err
		}
		total += int64(sz)
	}
	return total, syncfs(dir)
}

// syncfs flushes the file system holding path (sync -f).
func syncfs(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("syncfs %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", path, err)
	}
	return nil
}

// dropCaches writes back dirty data and empties the page, dentry and inode
// caches of the whole machine.
func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

// run runs a command and includes its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// statWalk lstat()s every entry below dir, as a "has anything changed"
// scan does; it returns the number of entries.
func statWalk(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := lstat(p, &st); err != nil {
			return err
		}
		n++
		return nil
	})
	return n, err
}

// openRead opens p read-only, retrying on EINTR (see lstat).
func openRead(p string) (int, error) {
	for {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// readAll reads the file at p sequentially with 1 MiB reads and returns
// the bytes read.
func readAll(p string, buf []byte) (int64, error) {
	fd, err := openRead(p)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var total int64
	for {
		n, err := unix.Read(fd, buf)
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, nil
		}
		total += int64(n)
	}
}

// countFiles counts the regular files below dir.
func countFiles(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	})
	return n, err
}

// removeAll deletes dir like os.RemoveAll, but unlinks with many goroutines:
// this machine's ext4 (no journal, mounted with discard) issues a
// synchronous discard for every freed block, so an unlink of a written-back
// file costs about a millisecond, and only parallel unlinks overlap them.
func removeAll(dir string) error {
	var files []string
	var dirs [][]string // by depth
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			depth := strings.Count(p[len(dir):], "/")
			for len(dirs) <= depth {
				dirs = append(dirs, nil)
			}
			dirs[depth] = append(dirs[depth], p)
			return nil
		}
		files = append(files, p)
		return nil
	})
	if err != nil {
		return os.RemoveAll(dir)
	}
	parallel := func(paths []string, fn func(string) error) {
		const workers = 32
		var wg sync.WaitGroup
		next := make(chan string)
		for range min(workers, len(paths)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for p := range next {
					fn(p) // what fails is left to os.RemoveAll below
				}
			}()
		}
		for _, p := range paths {
			next <- p
		}
		close(next)
		wg.Wait()
	}
	parallel(files, os.Remove)
	for i := len(dirs) - 1; i >= 0; i-- {
		parallel(dirs[i], os.Remove)
	}
	return os.RemoveAll(dir)
}
