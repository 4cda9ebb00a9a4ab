package fake

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/esf-dev/esf/vfs"
)

// chunkSize is the unit Upload collects a stream in: big enough that a
// 1 GiB file is a thousand slices, small enough that growing a file never
// copies what it already holds.
const chunkSize = 1 << 20

// content is a file's bytes as immutable chunks. Nothing writes into a
// chunk once it is part of a content, so a content can be read without a
// lock after it is taken from the tree.
type content struct {
	chunks [][]byte
	size   int64
}

func contentOf(b []byte) content {
	if len(b) == 0 {
		return content{}
	}
	return content{chunks: [][]byte{b}, size: int64(len(b))}
}

func (c content) bytes() []byte {
	out := make([]byte, 0, c.size)
	for _, ch := range c.chunks {
		out = append(out, ch...)
	}
	return out
}

// readContent collects r into a content, checking ctx before every Read so
// a cancelled upload stops within one Read of the cancellation.
func readContent(ctx context.Context, r io.Reader) (content, error) {
	var c content
	buf := make([]byte, chunkSize)
	n := 0
	for {
		if err := ctx.Err(); err != nil {
			return content{}, err
		}
		m, err := r.Read(buf[n:])
		n += m
		if n == len(buf) {
			c.chunks = append(c.chunks, buf)
			c.size += int64(n)
			buf, n = make([]byte, chunkSize), 0
		}
		if err == io.EOF {
			if n > 0 {
				// Copy the tail so a small file does not pin a whole chunk.
				c.chunks = append(c.chunks, slices.Clone(buf[:n]))
				c.size += int64(n)
			}
			return c, nil
		}
		if err != nil {
			return content{}, err
		}
	}
}

// contentReader streams a content; it is Download's io.ReadCloser.
type contentReader struct {
	ctx    context.Context
	chunks [][]byte
	off    int // offset in chunks[0]
	closed bool
}

func (r *contentReader) Read(p []byte) (int, error) {
	if r.closed {
		return 0, fs.ErrClosed
	}
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	for len(r.chunks) > 0 && r.off == len(r.chunks[0]) {
		r.chunks, r.off = r.chunks[1:], 0
	}
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	n := copy(p, r.chunks[0][r.off:])
	r.off += n
	return n, nil
}

func (r *contentReader) Close() error {
	r.closed = true
	r.chunks = nil
	return nil
}

// node is one entry of a tree, replaced whole on every change.
type node struct {
	mode  fs.FileMode // type bits and permissions
	mtime time.Time
	data  content // regular files only
}

func (n *node) info(p string) vfs.FileInfo {
	fi := vfs.FileInfo{Path: p, Mode: n.mode, ModTime: n.mtime}
	if n.mode.IsRegular() {
		fi.Size = n.data.size
	}
	return fi
}

// tree is a session's file system: absolute cleaned path to node, with "/"
// always present and every node's parent a directory.
type tree struct {
	mu    sync.RWMutex
	nodes map[string]*node
}

func newTree(now time.Time) *tree {
	return &tree{nodes: map[string]*node{"/": {mode: fs.ModeDir | 0o755, mtime: now}}}
}

func (t *tree) get(p string) (*node, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n, ok := t.nodes[p]
	return n, ok
}

// mkdirAll creates p and its missing parents with mode.
func (t *tree) mkdirAll(p string, mode fs.FileMode, now time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mkdirAllLocked("mkdir", p, mode, now)
}

func (t *tree) mkdirAllLocked(op, p string, mode fs.FileMode, now time.Time) error {
	if n, ok := t.nodes[p]; ok {
		if !n.mode.IsDir() {
			return &fs.PathError{Op: op, Path: p, Err: fmt.Errorf("not a directory: %w", fs.ErrInvalid)}
		}
		return nil
	}
	if err := t.mkdirAllLocked(op, path.Dir(p), fs.ModeDir|0o755, now); err != nil {
		return err
	}
	t.nodes[p] = &node{mode: mode, mtime: now}
	return nil
}

// put replaces (or creates) the regular file p with c. A new file gets mode
// 0644, a replaced one keeps its mode. parents says whether missing parent
// directories are created (Write, Upload) or an error (shell redirection).
func (t *tree) put(op, p string, c content, now time.Time, parents bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	mode := fs.FileMode(0o644)
	if old, ok := t.nodes[p]; ok {
		if old.mode.IsDir() {
			return &fs.PathError{Op: op, Path: p, Err: fmt.Errorf("is a directory: %w", fs.ErrInvalid)}
		}
		mode = old.mode
	}
	dir := path.Dir(p)
	if parents {
		if err := t.mkdirAllLocked(op, dir, fs.ModeDir|0o755, now); err != nil {
			return err
		}
	} else if n, ok := t.nodes[dir]; !ok {
		return &fs.PathError{Op: op, Path: p, Err: fs.ErrNotExist}
	} else if !n.mode.IsDir() {
		return &fs.PathError{Op: op, Path: p, Err: fmt.Errorf("not a directory: %w", fs.ErrInvalid)}
	}
	t.nodes[p] = &node{mode: mode, mtime: now, data: c}
	return nil
}

// chmod sets p's permission bits.
func (t *tree) chmod(op, p string, perm fs.FileMode) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.nodes[p]
	if !ok {
		return &fs.PathError{Op: op, Path: p, Err: fs.ErrNotExist}
	}
	c := *n
	c.mode = n.mode&^fs.ModePerm | perm&fs.ModePerm
	t.nodes[p] = &c
	return nil
}

// remove deletes p and, for a directory, everything under it.
func (t *tree) remove(op, p string) error {
	if p == "/" {
		return &fs.PathError{Op: op, Path: p, Err: fmt.Errorf("refusing to delete the root: %w", fs.ErrInvalid)}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.nodes[p]
	if !ok {
		return &fs.PathError{Op: op, Path: p, Err: fs.ErrNotExist}
	}
	delete(t.nodes, p)
	if n.mode.IsDir() {
		for k := range t.nodes {
			if strings.HasPrefix(k, p+"/") {
				delete(t.nodes, k)
			}
		}
	}
	return nil
}

// list is vfs.Backend.List over an absolute path.
func (t *tree) list(op, p string) ([]vfs.FileInfo, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n, ok := t.nodes[p]
	if !ok {
		return nil, &fs.PathError{Op: op, Path: p, Err: fs.ErrNotExist}
	}
	if !n.mode.IsDir() {
		return []vfs.FileInfo{n.info(p)}, nil
	}
	var out []vfs.FileInfo
	for k, c := range t.nodes {
		if k != "/" && path.Dir(k) == p {
			out = append(out, c.info(k))
		}
	}
	slices.SortFunc(out, func(a, b vfs.FileInfo) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

// file returns the regular file at p, for reading.
func (t *tree) file(op, p string) (*node, error) {
	n, ok := t.get(p)
	if !ok {
		return nil, &fs.PathError{Op: op, Path: p, Err: fs.ErrNotExist}
	}
	if n.mode.IsDir() {
		return nil, &fs.PathError{Op: op, Path: p, Err: fmt.Errorf("is a directory: %w", fs.ErrInvalid)}
	}
	return n, nil
}

// view is the vfs.ReadLister GlobWalk and GrepWalk walk: the tree itself,
// without the handle checks and fault calls the Session methods make once
// per Glob or Grep.
type view struct{ t *tree }

func (v view) List(ctx context.Context, p string) ([]vfs.FileInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return v.t.list("list", p)
}

func (v view) Read(ctx context.Context, p string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n, err := v.t.file("read", p)
	if err != nil {
		return nil, err
	}
	return n.data.bytes(), nil
}
