package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
)

// Dir imports the directory tree at path into st and returns its root.
//
// It records what the tree format holds: type, mode with setuid, setgid and
// sticky bits, owner, mtime in nanoseconds, xattrs of every namespace,
// device numbers, symlink targets verbatim and hard links (names that share
// an inode within the import form one link group). The root's own
// attributes become the root tree's. Sockets are skipped with a warning.
//
// Symlinks are never followed, except that path itself may be one. Mount
// points are crossed: the import is what a reader of path sees, as with
// tar's default. Files are hashed before anything is written, so importing
// the same tree again creates and writes no object.
func Dir(ctx context.Context, st Store, path string, opts Options) (Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Result{}, err
	}
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		return Result{}, fsError("import", path, err)
	}
	var rst unix.Stat_t
	if err := unix.Lstat(root, &rst); err != nil {
		return Result{}, fsError("import", path, err)
	}
	if rst.Mode&unix.S_IFMT != unix.S_IFDIR {
		return Result{}, fmt.Errorf("import %s: not a directory: %w", path, cas.ErrInvalidArgument)
	}
	return importDir(ctx, st, root, cas.ZeroID, false, "dir", path, opts)
}

// importDir walks the directory root onto a Builder over base (an overlay
// upper directory when overlay is set), writes the trees and commits the
// objects. kind and path name the import in logs and errors.
func importDir(ctx context.Context, st Store, root string, base cas.ID, overlay bool, kind, path string, opts Options) (Result, error) {
	d := &dirImport{
		root:    root,
		st:      st,
		opts:    opts,
		prog:    newProgress(opts.Progress),
		obj:     newObjects(st),
		seen:    map[string]bool{},
		overlay: overlay,
	}
	// An upper directory holds what an attempt wrote: new content.
	d.hashFirst.Store(!overlay && !opts.NewContent)
	published := false
	if dc, ok := st.(cas.DeletionCounter); ok && d.statCache().bind(dc) {
		d.deletions = dc
		if n, ok := dc.Deletions(); ok {
			d.token = d.statCache().beginImport(n)
			// Resolved after finish below; forgotten on any failure.
			defer func() {
				if !published {
					d.statCache().endImport(d.token, false)
				}
			}()
		}
	}
	defer d.obj.abort()
	b := cas.NewBuilder(st, base)
	s, err := d.run(ctx, b)
	if err != nil {
		return Result{}, err
	}
	d.prog.done()
	id, err := d.obj.finish(ctx, b, &s)
	if err != nil {
		if overlay {
			path = "/" // the sandbox's root, never the host's upper dir
		}
		return Result{}, fmt.Errorf("%s %s: %w", kind, path, err)
	}
	// Every object is published now: what the import read is present as
	// of the count read when it started.
	d.statCache().endImport(d.token, true)
	published = true
	logDone(opts.Logger, kind, path, id, &s)
	return Result{Root: id, Stats: s}, nil
}

// dirImport is one directory import. One walker lists directories, a pool
// of workers inspects every entry (lstat, xattrs, content) and the calling
// goroutine alone stages results into the Builder, which is not safe for
// concurrent use. Entries arrive in any order: Builder.Put creates missing
// parents and a later Put of the directory itself only sets its attributes.
//
// Every entry below the root is reached relative to a descriptor of its
// parent directory (openat, fstatat, readlinkat; xattrs through
// /proc/self/fd/N/name), never by its full path: a tree may be deeper than
// PATH_MAX from the host's side (an attempt's upper dir is a sandbox root
// that already sits deep in the host) and must import all the same. A
// directory stays open while the walker lists it, while one of its
// subdirectories waits on the walker's stack, and while a job for one of
// its entries waits for a worker (dirRef counts them), so open descriptors
// grow with the depth of the tree plus the jobs in flight, not with its
// size.
type dirImport struct {
	root string
	st   Store
	opts Options
	prog *progress
	obj  *objects

	mu   sync.Mutex
	seen map[string]bool // link keys of regular files already claimed for hashing

	// overlay reads root as an overlayfs upper directory (see Upper).
	overlay bool

	// hashFirst guesses that the next large file is stored already (see
	// file). It starts true for Dir, unless Options.NewContent, and false
	// for Upper, then follows the last large file.
	hashFirst atomic.Bool

	// deletions is the store's deletion counter when the StatCache may
	// trust it (see trusted); nil: every hit asks the store.
	deletions cas.DeletionCounter
	// token is the present stamp of the files this import reads (see
	// StatCache.beginImport); 0 without deletions.
	token uint64
}

// noter is a store that records an id as Has does without asking the
// disk (gc.Tracker.Note).
type noter interface {
	Note(ctx context.Context, id cas.ID)
}

// trusted reports whether the object id of a StatCache hit whose present
// stamp is present is stored without asking the store: its deletion count
// has not moved since the object was known stored. It tells a collection
// running meanwhile that the import uses id first, as Has would: a
// deletion the collection starts after that keeps id, and one that
// started before moved the count already.
func (d *dirImport) trusted(ctx context.Context, id cas.ID, present uint64) bool {
	if d.deletions == nil || present == 0 {
		return false
	}
	if n, ok := d.st.(noter); ok {
		n.Note(ctx, id)
	}
	n, ok := d.deletions.Deletions()
	return ok && n+1 == present
}

// count returns the store's deletion count now, ok false when the
// StatCache does not trust it.
func (d *dirImport) count() (uint64, bool) {
	if d.deletions == nil {
		return 0, false
	}
	return d.deletions.Deletions()
}

type dirJob struct {
	rel string // slash-separated path below the root; "" is the root
	dir bool   // what readdir reported; the walker descends into it
	// parent holds the directory the entry name is in, nil for the root
	// (reached by its path). The job owns one reference.
	parent *dirRef
	name   string
}

// at is the entry as a directory descriptor and a name for the *at calls.
func (j *dirJob) at(d *dirImport) (int, string) {
	if j.parent == nil {
		return unix.AT_FDCWD, d.root
	}
	return j.parent.fd, j.name
}

// done drops the job's reference to its parent directory.
func (j *dirJob) done() {
	if j.parent != nil {
		j.parent.release()
		j.parent = nil
	}
}

// dirRef is a directory descriptor shared by the walker and the jobs of
// the directory's entries; the last release closes it.
type dirRef struct {
	fd   int
	refs atomic.Int64
}

func newDirRef(fd int) *dirRef {
	r := &dirRef{fd: fd}
	r.refs.Store(1)
	return r
}

func (r *dirRef) acquire() *dirRef {
	r.refs.Add(1)
	return r
}

func (r *dirRef) release() {
	if r.refs.Add(-1) == 0 {
		unix.Close(r.fd)
	}
}

const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

type dirResult struct {
	rel   string
	entry cas.Entry
	key   string // link key (dev:ino) of a non-directory with several links
	// alias marks a further name of a regular file whose content another
	// worker hashes under key; it takes that entry once all are staged.
	alias   bool
	skipped string // why the entry was skipped
	bytes   int64  // content bytes read
	// In an overlay upper directory: whiteout deletes the path, opaque
	// clears what the directory had below it.
	whiteout, opaque bool
}

// statCache is Options.StatCache, never for an upper directory.
func (d *dirImport) statCache() *StatCache {
	if d.overlay {
		return nil
	}
	return d.opts.StatCache
}

func (d *dirImport) abs(rel string) string {
	if rel == "" {
		return d.root
	}
	return d.root + "/" + rel
}

// show names rel in errors and logs: for a seal, the path the sandbox
// sees ("/a/b"), never the host's upper dir; for an import, the host path.
func (d *dirImport) show(rel string) string {
	if d.overlay {
		return "/" + rel
	}
	return d.abs(rel)
}

// procFD says whether /proc/self/fd resolves, for the xattr calls that
// have no *at form.
var procFD = sync.OnceValue(func() bool {
	var st unix.Stat_t
	return unix.Stat("/proc/self/fd", &st) == nil
})

// xattrPath names an entry for the l*xattr calls without its full path:
// the kernel resolves the magic link of the parent's descriptor, then the
// one name, and does not follow a final symlink.
func (d *dirImport) xattrPath(j *dirJob) string {
	if j.parent == nil {
		return d.root
	}
	if !procFD() {
		return d.abs(j.rel) // fails past PATH_MAX, as before
	}
	return "/proc/self/fd/" + strconv.Itoa(j.parent.fd) + "/" + j.name
}

func (d *dirImport) run(ctx context.Context, b *cas.Builder) (Stats, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan dirJob, 4*d.opts.Workers)
	results := make(chan dirResult, 4*d.opts.Workers)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(jobs)
		if err := d.walk(ctx, jobs); err != nil {
			cancel(err)
		}
	})
	for range d.opts.Workers {
		wg.Go(func() {
			if err := d.work(ctx, jobs, results); err != nil {
				cancel(err)
			}
		})
	}
	// Closing results ends the loop below only once every goroutine is
	// done, so none outlives the call.
	go func() {
		wg.Wait()
		close(results)
	}()
	// Jobs no worker took (after a failure) still hold their directories.
	defer func() {
		for j := range jobs {
			j.done()
		}
	}()

	var s Stats
	firsts := map[string]cas.Entry{}
	var aliases, pending []dirResult
	for r := range results {
		if ctx.Err() != nil {
			continue // drain
		}
		switch {
		case r.skipped != "":
			d.opts.Logger.Warn("import: skipping entry", "path", r.rel, "reason", r.skipped)
			s.Skipped = append(s.Skipped, r.rel)
		case r.alias:
			aliases = append(aliases, r)
		case d.overlay:
			// Whiteouts and opaque directories must apply before what lies
			// below them: stage once every entry is in, parents first.
			pending = append(pending, r)
		default:
			if err := b.Put(ctx, r.rel, r.entry, r.key); err != nil {
				cancel(fmt.Errorf("import %s: %w", d.show(r.rel), err))
				continue
			}
			s.count(r.entry.Type)
			s.Bytes += r.bytes
			if r.key != "" {
				firsts[r.key] = r.entry
			}
		}
	}
	if ctx.Err() != nil {
		return Stats{}, context.Cause(ctx)
	}
	if err := d.stageOverlay(ctx, b, pending, firsts, &s); err != nil {
		return Stats{}, err
	}
	for _, a := range aliases {
		e, ok := firsts[a.key]
		if !ok {
			return Stats{}, fmt.Errorf("import %s: hard link %s lost its first name", d.show(a.rel), a.key)
		}
		if err := b.Put(ctx, a.rel, e, a.key); err != nil {
			return Stats{}, fmt.Errorf("import %s: %w", d.show(a.rel), err)
		}
		s.Files++
	}
	slices.Sort(s.Skipped)
	return s, nil
}

// walk lists directories depth first and queues every entry, the root
// first, each with a reference to its open parent directory.
func (d *dirImport) walk(ctx context.Context, jobs chan<- dirJob) error {
	send := func(j dirJob) error {
		select {
		case jobs <- j:
			return nil
		case <-ctx.Done():
			j.done()
			return context.Cause(ctx)
		}
	}
	if err := send(dirJob{rel: "", dir: true}); err != nil {
		return err
	}
	fd, err := unix.Open(d.root, dirFlags, 0)
	if err != nil {
		return walkError("read directory", d.show(""), err)
	}
	// A directory still to list: its parent's reference and its name.
	type todo struct {
		parent    *dirRef
		name, rel string
	}
	root := newDirRef(fd)
	stack := []todo{{rel: ""}}
	defer func() {
		for _, t := range stack {
			if t.parent != nil {
				t.parent.release()
			}
		}
	}()
	for len(stack) > 0 {
		t := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		dir := root
		if t.parent != nil {
			cfd, err := unix.Openat(t.parent.fd, t.name, dirFlags, 0)
			t.parent.release()
			if err != nil {
				return walkError("read directory", d.show(t.rel), err)
			}
			dir = newDirRef(cfd)
		}
		err := d.readDir(dir, t.rel, func(name string, isDir bool) error {
			child := name
			if t.rel != "" {
				child = t.rel + "/" + name
			}
			if d.excluded(child) {
				return nil
			}
			if isDir {
				stack = append(stack, todo{parent: dir.acquire(), name: name, rel: child})
			}
			return send(dirJob{rel: child, dir: isDir, parent: dir.acquire(), name: name})
		})
		dir.release()
		if err != nil {
			return err
		}
	}
	return nil
}

// excluded reports whether rel is one of Options.Exclude.
func (d *dirImport) excluded(rel string) bool {
	for _, x := range d.opts.Exclude {
		if strings.Trim(x, "/") == rel {
			return true
		}
	}
	return false
}

// readDir lists the directory dir (rel) through a fresh open file
// description, so dir's descriptor keeps its offset for the *at calls.
func (d *dirImport) readDir(dir *dirRef, rel string, fn func(name string, dir bool) error) error {
	p := d.show(rel)
	fd, err := unix.Openat(dir.fd, ".", dirFlags, 0)
	if err != nil {
		return walkError("read directory", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	for {
		ents, err := f.ReadDir(1024)
		for _, e := range ents {
			if err := fn(e.Name(), e.IsDir()); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return walkError("read directory", p, err)
		}
	}
}

// Pools of file buffers across imports: smallPool's for the files that
// fit in one (most files of a source tree, every file of a huge directory
// of small ones), bufPool's of smallFileMax for the rest. A worker holds
// one of each at most, so a tree of small files costs its workers
// smallBufSize each rather than a megabyte each for the whole import.
var (
	smallPool = sync.Pool{New: func() any { b := make([]byte, smallBufSize); return &b }}
	bufPool   = sync.Pool{New: func() any { b := make([]byte, smallFileMax); return &b }}
)

// smallBufSize is the buffer of a file whose lstat size is below it.
const smallBufSize = 64 << 10

// scratch is a worker's file buffers, each taken from its pool on first
// use: workers that only see directories need none.
type scratch struct{ small, large *[]byte }

// get returns a buffer for a file whose lstat size is size: one it fits
// in with a byte to spare, so that reading it whole ends at EOF (file
// reads content up to its buffer's length at once), or smallFileMax. A
// file that grew past its buffer since the lstat takes file's road for
// large content, as one over smallFileMax does.
func (s *scratch) get(size int64) []byte {
	if size < smallBufSize {
		if s.small == nil {
			s.small = smallPool.Get().(*[]byte)
		}
		return *s.small
	}
	if s.large == nil {
		s.large = bufPool.Get().(*[]byte)
	}
	return *s.large
}

func (s *scratch) release() {
	if s.small != nil {
		smallPool.Put(s.small)
	}
	if s.large != nil {
		bufPool.Put(s.large)
	}
}

func (d *dirImport) work(ctx context.Context, jobs <-chan dirJob, out chan<- dirResult) error {
	var buf scratch
	defer buf.release()
	for {
		var j dirJob
		select {
		case jj, ok := <-jobs:
			if !ok {
				return nil
			}
			j = jj
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		r, err := d.inspect(ctx, j, &buf)
		if err != nil {
			return err
		}
		select {
		case out <- r:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// claim reports whether the caller is the first to see the inode key and
// so must hash its content.
func (d *dirImport) claim(key string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen[key] {
		return false
	}
	d.seen[key] = true
	return true
}

func (d *dirImport) inspect(ctx context.Context, j dirJob, buf *scratch) (dirResult, error) {
	defer j.done()
	dirfd, name := j.at(d)
	p := d.show(j.rel)
	r := dirResult{rel: j.rel}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return r, walkError("import", p, err)
	}
	typ := st.Mode & unix.S_IFMT
	if (typ == unix.S_IFDIR) != j.dir {
		return r, fmt.Errorf("import %s: changed during import: %w", p, errdefs.ErrConflict)
	}
	switch typ {
	case unix.S_IFSOCK:
		r.skipped = "socket"
		return r, nil
	case unix.S_IFDIR, unix.S_IFREG, unix.S_IFLNK, unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
	default:
		r.skipped = fmt.Sprintf("unknown file type %#o", typ)
		return r, nil
	}
	if d.overlay && typ == unix.S_IFCHR && st.Rdev == 0 {
		r.whiteout = true
		return r, nil
	}
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		r.key = strconv.FormatUint(st.Dev, 10) + ":" + strconv.FormatUint(st.Ino, 10)
		if typ == unix.S_IFREG && !d.claim(r.key) {
			r.alias = true
			return r, nil
		}
	}
	e := &r.entry
	e.Attr = cas.Attr{
		Mode:    st.Mode & cas.ModeMask,
		UID:     st.Uid,
		GID:     st.Gid,
		MtimeNs: timeNs(st.Mtim.Sec, st.Mtim.Nsec),
	}
	// A regular file unchanged since an earlier import (see StatCache):
	// its content is trusted stored if the store removed nothing since it
	// was known stored, else asked of the store; either tells a collection
	// the object is used. It is re-read if the store lost it.
	cache := d.statCache()
	if typ == unix.S_IFREG {
		if id, xs, present, ok := cache.lookup(&st); ok {
			has := d.trusted(ctx, id, present)
			if !has {
				n, counted := d.count() // before the check: see cas.DeletionCounter
				var err error
				if has, err = d.st.Has(ctx, id); err != nil {
					return r, fmt.Errorf("import %s: %w", p, err)
				}
				if has && counted {
					cache.confirm(&st, id, n)
				}
			}
			if has {
				e.Type, e.ID, e.Size, e.Xattrs = cas.TypeFile, id, st.Size, xs
				r.bytes = e.Size
				return r, nil
			}
		}
	}
	xs, err := readXattrs(d.xattrPath(&j), p)
	if err != nil {
		return r, fmt.Errorf("import: %w", err)
	}
	e.Xattrs = xs
	if d.overlay {
		e.Xattrs, r.opaque = overlayXattrs(xs)
	}
	switch typ {
	case unix.S_IFDIR:
		e.Type = cas.TypeDir
	case unix.S_IFREG:
		e.Type = cas.TypeFile
		start := cache.now()
		e.ID, e.Size, e.Holes, err = d.file(ctx, dirfd, name, j.rel, p, &st, e.Xattrs, buf.get(st.Size))
		if err != nil {
			return r, err
		}
		r.bytes = e.Size
		if len(e.Holes) == 0 && e.Size == st.Size {
			cache.rememberAs(&st, e.ID, e.Xattrs, start, d.token)
		}
	case unix.S_IFLNK:
		e.Type = cas.TypeSymlink
		if e.Target, err = readlinkAt(dirfd, name, st.Size); err != nil {
			return r, walkError("import", p, err)
		}
		// Linux ignores a symlink's mode and always shows 0777; tar
		// writers disagree, so both importers store 0777.
		e.Mode = 0o777
	case unix.S_IFCHR, unix.S_IFBLK:
		e.Type = cas.TypeCharDev
		if typ == unix.S_IFBLK {
			e.Type = cas.TypeBlockDev
		}
		e.Major, e.Minor = unix.Major(st.Rdev), unix.Minor(st.Rdev)
	case unix.S_IFIFO:
		e.Type = cas.TypeFIFO
	}
	return r, nil
}

// file hashes the regular file p and stores it unless the store has it.
// Content shorter than buf (scratch.get: at most smallFileMax) is read
// once into buf, hashed and put only when the store lacks it.
//
// Content that fills buf takes one of two roads, by a guess (d.hashFirst) that
// follows the last large file of the import. Guessing stored, it hashes the
// file in a first pass and streams it into Put in a second only if the
// store lacks it, so importing what is stored writes nothing. Guessing new,
// it streams the file into Put once: the store hashes as it writes and
// drops its temp copy, unpublished, if the content turns out stored. A
// wrong guess costs a second hashing pass, or a discarded temp file. Memory
// stays at one buffer per worker (plus the store's pipeline) either way.
//
// A seal with Options.Adopt hands a large file with one name to the store
// instead (see adopt).
//
// The file is name in dirfd, rel below the root; p names it in errors and
// logs; xs are its extended attributes.
func (d *dirImport) file(ctx context.Context, dirfd int, name, rel, p string, st *unix.Stat_t, xs []cas.Xattr, buf []byte) (cas.ID, int64, []cas.Hole, error) {
	// O_NONBLOCK: should p have been swapped for a fifo since the lstat,
	// the open must not hang (the fstat check below then fails).
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return cas.ZeroID, 0, nil, walkError("import", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return cas.ZeroID, 0, nil, walkError("import", p, err)
	}
	if fst.Dev != st.Dev || fst.Ino != st.Ino {
		return cas.ZeroID, 0, nil, fmt.Errorf("import %s: changed during import: %w", p, errdefs.ErrConflict)
	}
	holes, err := fileHoles(fd, &fst)
	if err != nil {
		return cas.ZeroID, 0, nil, readError(ctx, p, err)
	}
	hc := newHoleCheck(f, holes, fst.Size)
	r := ctxReader{ctx: ctx, r: hc}
	n, err := io.ReadFull(r, buf)
	d.prog.add(int64(n))
	switch err {
	case io.EOF, io.ErrUnexpectedEOF:
		data := buf[:n]
		id := cas.Sum(data)
		d.checkSize(p, st, int64(n))
		if _, _, err := d.obj.putBytes(ctx, data, id); err != nil {
			return cas.ZeroID, 0, nil, fmt.Errorf("import %s: %w", p, err)
		}
		return id, int64(n), hc.result(int64(n)), nil
	case nil:
	default:
		return cas.ZeroID, 0, nil, readError(ctx, p, err)
	}

	if d.overlay && d.opts.Adopt != nil && fst.Nlink == 1 {
		id, size, err := d.adopt(ctx, f, rel, p, &fst, xs, hc, buf[:n])
		return id, size, hc.result(size), err
	}
	if !d.hashFirst.Load() {
		id, size, err := d.streamFile(ctx, p, st, hc, buf[:n])
		return id, size, hc.result(size), err
	}
	h := cas.NewHasher()
	h.Write(buf)
	size := int64(n)
	for {
		m, err := r.Read(buf)
		h.Write(buf[:m])
		size += int64(m)
		d.prog.add(int64(m))
		if err == io.EOF {
			break
		}
		if err != nil {
			return cas.ZeroID, 0, nil, readError(ctx, p, err)
		}
	}
	id := cas.IDFromHash(h)
	d.checkSize(p, st, size)
	has, err := d.st.Has(ctx, id)
	if err != nil {
		return cas.ZeroID, 0, nil, fmt.Errorf("import %s: %w", p, err)
	}
	if has {
		return id, size, hc.result(size), nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return cas.ZeroID, 0, nil, readError(ctx, p, err)
	}
	// New content after all: guess so for the next large file.
	d.hashFirst.Store(false)
	info, _, err := d.obj.put(ctx, ctxReader{ctx: ctx, r: f})
	if err != nil {
		if ctx.Err() != nil {
			return cas.ZeroID, 0, nil, context.Cause(ctx)
		}
		return cas.ZeroID, 0, nil, fmt.Errorf("import %s: %w", p, err)
	}
	if info.ID != id {
		// What is stored is what the tree must name.
		d.opts.Logger.Warn("import: file changed as we read it", "path", p)
		return info.ID, info.Size, nil, nil
	}
	return id, size, hc.result(size), nil
}

// streamFile stores the large file read by f, whose first bytes (already
// read and counted) are head, in one pass: the store hashes what it writes.
func (d *dirImport) streamFile(ctx context.Context, p string, st *unix.Stat_t, f io.Reader, head []byte) (cas.ID, int64, error) {
	r := io.MultiReader(bytes.NewReader(head), &progressReader{r: ctxReader{ctx: ctx, r: f}, prog: d.prog})
	info, created, err := d.obj.put(ctx, r)
	if err != nil {
		if ctx.Err() != nil {
			return cas.ZeroID, 0, context.Cause(ctx)
		}
		return cas.ZeroID, 0, fmt.Errorf("import %s: %w", p, err)
	}
	if !created {
		// Stored already (or by another worker of this import): the next
		// large file is likely a re-import too.
		d.hashFirst.Store(true)
	}
	d.checkSize(p, st, info.Size)
	return info.ID, info.Size, nil
}

// adopt stores the large file f, whose first bytes (already read and
// counted) are head, whose fstat is st and whose extended attributes are
// xs, by handing its inode to the
// store (cas.Adopter): it is read once, to hash it, and never copied. The
// caller (Options.Adopt) is told first, so it can give the upper directory
// its own copy back should the seal not commit.
func (d *dirImport) adopt(ctx context.Context, f *os.File, rel, p string, st *unix.Stat_t, xs []cas.Xattr, r io.Reader, head []byte) (cas.ID, int64, error) {
	if err := d.opts.Adopt(rel, st.Mode&cas.ModeMask, st.Uid, st.Gid, xs); err != nil {
		return cas.ZeroID, 0, fmt.Errorf("import %s: %w", p, err)
	}
	r = io.MultiReader(bytes.NewReader(head), &progressReader{r: ctxReader{ctx: ctx, r: r}, prog: d.prog})
	info, _, err := d.obj.adopt(ctx, f, r)
	if err != nil {
		if ctx.Err() != nil {
			return cas.ZeroID, 0, context.Cause(ctx)
		}
		return cas.ZeroID, 0, fmt.Errorf("import %s: %w", p, err)
	}
	d.checkSize(p, st, info.Size)
	return info.ID, info.Size, nil
}

// readlinkAt reads the target of the symlink name in dirfd, whose lstat
// size was size (a hint: some filesystems report 0).
func readlinkAt(dirfd int, name string, size int64) (string, error) {
	n := int(size) + 1
	if n < 256 {
		n = 256
	}
	for {
		b := make([]byte, n)
		m, err := unix.Readlinkat(dirfd, name, b)
		if err != nil {
			return "", err
		}
		if m < n || n >= 1<<16 {
			return string(b[:m]), nil
		}
		n *= 4 // it may have been truncated
	}
}

// progressReader reports what it reads to prog.
type progressReader struct {
	r    io.Reader
	prog *progress
}

func (r *progressReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.prog.add(int64(n))
	return n, err
}

func (d *dirImport) checkSize(p string, st *unix.Stat_t, n int64) {
	if n != st.Size {
		d.opts.Logger.Warn("import: file changed as we read it", "path", p, "stat_size", st.Size, "read", n)
	}
}

func readError(ctx context.Context, p string, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return fmt.Errorf("import %s: read: %w", p, err)
}

// fsError wraps a failure to reach an import's input: missing is not found.
func fsError(op, p string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s %s: %v: %w", op, p, err, cas.ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

// walkError wraps a failure below the import root: a path that vanished or
// changed type since readdir saw it is a conflict with a concurrent writer.
func walkError(op, p string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("%s %s: changed during import: %v: %w", op, p, err, errdefs.ErrConflict)
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}
