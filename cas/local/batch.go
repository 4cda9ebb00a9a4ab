//go:build linux

package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

var _ cas.Batcher = (*Store)(nil)

// NewBatch implements cas.Batcher with group commit: the durability protocol
// of Put, paid once per batch instead of once per object, and with a single
// flush.
//
// Put writes a read-only temp file in <dir>/tmp while hashing, without
// fsync, named tmp/pub-<id>-<batch>-<seq> (a streamed object is renamed to
// that name once hashed), and remembers only its id and a sequence number
// (never content). Objects already stored or already in the batch are not
// written again; small ones are hashed in memory first, as Put does, so they
// cost one stat.
//
// Commit then:
//  1. creates the fan-out directories the batch needs;
//  2. calls syncfs(2) once, which makes every temp file (data, size, mode,
//     name) and those directories durable in one flush of the filesystem
//     instead of one fsync per file;
//  3. links each temp file into place with link(2), which never replaces,
//     in id order, checking the context between links, and leaves the temp
//     name (the object's redo record) for a later flush to retire.
//
// The links are not flushed (a second syncfs per batch was the price of
// making them durable at once, a seal's second flush in a row): each
// object is durable already under its tmp/pub- name, and Open redoes the
// publication of every pub- file a crash left (see redoPublications): it
// removes those whose object exists, and links in those whose content
// hashes to the id they name, so a link lost by a crash comes back before
// anyone reads the store. A pub- name is retired (unlinked) only once a
// later flush has made its link durable: the next Commit's syncfs, which
// flushes every link made before it started. Hard links rather than
// renames so that no crash can lose both names of an object, whatever the
// filesystem's ordering of directory updates.
//
// With Options.SmallBatch set, a small batch (at most that many new
// objects: a seal of a few changed files) flushes file by file instead,
// because syncfs writes back every dirty page of the file system, anyone's,
// and so costs what the busiest other writer on it has pending: Put keeps
// such a batch's temp files open, step 1 makes new fan-out directories
// durable as Put does, step 2 fsyncs the temp files in parallel, step 3
// renames them (as Put does) and step 4 fsyncs the fan-out directories the
// renames touched, in parallel too; until it returns the renamed ids are
// registered as in flight, so a concurrent Put that finds one fsyncs its
// directory before reporting it stored. The first Put past the limit closes
// the files and the batch goes on with syncfs.
//
// No name is published before step 2 returns, so whatever a crash leaves
// under objects/ is whole.
//
// Errors: syncfs reports writeback errors of the whole filesystem that
// happened since its file descriptor was opened (Linux >= 5.8; older kernels
// report none). The batch opens that descriptor at its first Put, before it
// writes anything, so a failed writeback of any of its temp files fails
// Commit. A failure of an unrelated file on the same filesystem fails it too,
// which is conservative, not wrong.
//
// Costs and limits: syncfs also flushes whatever else is dirty on the
// filesystem, so a Commit waits for other writers' data too. Keep batches
// short-lived (seconds, bounded by count or bytes): temp files older than
// Options.StaleTempAge may be removed by another process's Open, which would
// fail the Commit.
//
// The batch is built only on Linux; elsewhere the store is no Batcher and
// cas.NewBatch falls back to Put.
func (s *Store) NewBatch() cas.Batch {
	b := &batch{
		s:        s,
		syncfs:   unix.Syncfs,
		fsync:    unix.Fsync,
		syncDir:  syncDir,
		rename:   renameNoReplace,
		link:     os.Link,
		smallMax: s.smallBatch,
		prefix:   "batch-" + strconv.FormatUint(rand.Uint64(), 16) + "-",
		fd:       -1,
		objs:     map[cas.ID]uint64{},
	}
	if b.smallMax > 0 {
		b.open = map[uint64]int{}
	}
	return b
}

type batch struct {
	s *Store
	// Seams for tests; unix.Syncfs, unix.Fsync, syncDir, renameNoReplace
	// and os.Link otherwise.
	syncfs  func(fd int) error
	fsync   func(fd int) error
	syncDir func(dir string) error
	rename  func(oldpath, newpath string) error
	link    func(oldpath, newpath string) error
	// smallMax is Options.SmallBatch (0: always syncfs).
	smallMax int

	// Temp files are prefix + a sequence number, so the batch can name them
	// from the number alone. The prefix is random per batch; O_EXCL guards
	// against the unlikely clash.
	prefix string
	seq    atomic.Uint64

	mu    sync.Mutex
	ended bool
	// fd is the store's tmp directory, opened by the first Put (-1 before):
	// syncfs is called on it and reports errors since it was opened.
	fd   int
	objs map[cas.ID]uint64 // id -> temp file sequence number
	// large maps the streamed objects of at least VerifyMin bytes to the
	// inode of their temp file, to note them verified once linked.
	large map[cas.ID]uint64
	// open holds the descriptors of the temp files while the batch is
	// small (sequence number -> fd); nil once it flushes with syncfs.
	open map[uint64]int
	// logged holds a copy of every object while the batch can be made
	// durable by the store's redo log (all in memory, small); unlogged
	// once it cannot.
	logged      []redoObject
	loggedBytes int
	unlogged    bool
}

// tempPath is the temp file of a streamed object before it is hashed.
func (b *batch) tempPath(seq uint64) string {
	return filepath.Join(b.s.tmp, b.prefix+strconv.FormatUint(seq, 10))
}

// pubPath is the temp file of object id: its redo record once flushed.
func (b *batch) pubPath(id cas.ID, seq uint64) string {
	return filepath.Join(b.s.tmp, pubPrefix+id.String()+"-"+b.prefix+strconv.FormatUint(seq, 10))
}

func errEnded(op string) error {
	return fmt.Errorf("batch %s: batch already ended: %w", op, cas.ErrFailedPrecondition)
}

// start checks that the batch is open and opens its descriptor on first use.
func (b *batch) start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return errEnded("put")
	}
	if b.fd < 0 {
		fd, err := unix.Open(b.s.tmp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("batch put: open %s: %w", b.s.tmp, err)
		}
		b.fd = fd
	}
	return nil
}

// known reports whether id needs no temp file: it is in the batch already,
// or stored (and then durable, see Store.existing).
func (b *batch) known(id cas.ID) (bool, error) {
	b.mu.Lock()
	_, in := b.objs[id]
	b.mu.Unlock()
	if in {
		return true, nil
	}
	return b.s.existing(id)
}

// Put implements cas.Putter for the batch (see Store.NewBatch).
func (b *batch) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	if err := b.start(); err != nil {
		return cas.Info{}, false, err
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp

	n, eof, err := fill(ctx, r, buf)
	if err != nil {
		return cas.Info{}, false, fmt.Errorf("batch put: %w", err)
	}
	var info cas.Info
	if eof {
		info = cas.Info{ID: cas.Sum(buf[:n]), Size: int64(n)}
		if known, err := b.known(info.ID); err != nil || known {
			return info, false, err
		}
	}

	var ino uint64 // of a large streamed object's temp file
	seq := b.seq.Add(1)
	name := b.tempPath(seq)
	if eof {
		name = b.pubPath(info.ID, seq)
	}
	f, err := createTemp(name)
	if err != nil {
		return cas.Info{}, false, fmt.Errorf("batch put: %w", err)
	}
	kept := false
	defer func() {
		f.close()
		if !kept {
			os.Remove(f.name)
		}
	}()
	if eof {
		if err := f.write(buf[:n]); err != nil {
			return cas.Info{}, false, fmt.Errorf("batch put: %w", err)
		}
	} else {
		h := cas.NewHasher()
		size, err := stream(ctx, r, buf[:n], h, f.fd, f.write)
		if err != nil {
			return cas.Info{}, false, fmt.Errorf("batch put: %w", err)
		}
		info = cas.Info{ID: cas.IDFromHash(h), Size: size}
		if size >= VerifyMin {
			var st unix.Stat_t
			if unix.Fstat(f.fd, &st) == nil {
				ino = st.Ino
			}
		}
	}
	// Read-only before anything can publish it, and covered by Commit's
	// flush like the data.
	if err := f.chmod(0o444); err != nil {
		return cas.Info{}, false, fmt.Errorf("batch put: %w", err)
	}
	if !eof {
		if known, err := b.known(info.ID); err != nil || known {
			return info, false, err
		}
		pub := b.pubPath(info.ID, seq)
		if err := os.Rename(f.name, pub); err != nil {
			return cas.Info{}, false, fmt.Errorf("batch put: %w", err)
		}
		f.name = pub
	}
	if err := ctx.Err(); err != nil {
		return cas.Info{}, false, fmt.Errorf("batch put %s: %w", info.ID, err)
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		// Put raced with Commit or Abort (a misuse): drop the file rather
		// than leak it.
		return cas.Info{}, false, errEnded("put")
	}
	if _, dup := b.objs[info.ID]; dup {
		return info, false, nil // a concurrent Put of the same bytes won
	}
	if b.open != nil && len(b.open) < b.smallMax {
		// Commit fsyncs it through this descriptor, opened before the
		// write: it reports any writeback error of the file.
		b.open[seq], f.fd = f.fd, -1
	} else {
		b.closeOpenLocked() // from here on the batch flushes with syncfs
		if err := f.close(); err != nil {
			return cas.Info{}, false, fmt.Errorf("batch put: %w", err)
		}
	}
	b.objs[info.ID] = seq
	b.logLocked(info.ID, buf[:n], eof)
	if ino != 0 {
		if b.large == nil {
			b.large = map[cas.ID]uint64{}
		}
		b.large[info.ID] = ino
	}
	kept = true
	return info, true, nil
}

// logLocked keeps a copy of object id, whose bytes are data if whole, for
// the redo log while the batch is small enough for it. b.mu is held.
func (b *batch) logLocked(id cas.ID, data []byte, whole bool) {
	if b.unlogged || b.s.log == nil {
		return
	}
	if !whole || len(b.logged) >= redoMaxObjects || b.loggedBytes+len(data) > redoMaxBytes {
		b.unlogged, b.logged = true, nil
		return
	}
	b.logged = append(b.logged, redoObject{id: id, data: bytes.Clone(data)})
	b.loggedBytes += len(data)
}

// closeOpenLocked closes the temp files a small batch kept open and turns
// it into one that flushes with syncfs. b.mu is held.
func (b *batch) closeOpenLocked() {
	for _, fd := range b.open {
		unix.Close(fd)
	}
	b.open = nil
}

// rawFile is a temp file written with bare system calls. os.File would add
// five calls per file (fcntl and epoll_ctl to try the poller, which refuses
// regular files), a cost that shows when each object is a few KiB and every
// system call exits to the hypervisor.
type rawFile struct {
	fd   int // -1 once closed
	name string
}

func createTemp(name string) (*rawFile, error) {
	fd, err := unix.Open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "create", Path: name, Err: err}
	}
	return &rawFile{fd: fd, name: name}, nil
}

func (f *rawFile) write(p []byte) error {
	for len(p) > 0 {
		n, err := unix.Write(f.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err == nil && n == 0 {
			err = io.ErrShortWrite
		}
		if err != nil {
			return &os.PathError{Op: "write", Path: f.name, Err: err}
		}
		p = p[n:]
	}
	return nil
}

func (f *rawFile) chmod(mode uint32) error {
	if err := unix.Fchmod(f.fd, mode); err != nil {
		return &os.PathError{Op: "chmod", Path: f.name, Err: err}
	}
	return nil
}

// close closes the file once; later calls do nothing.
func (f *rawFile) close() error {
	if f.fd < 0 {
		return nil
	}
	err := unix.Close(f.fd)
	f.fd = -1
	if err != nil {
		return &os.PathError{Op: "close", Path: f.name, Err: err}
	}
	return nil
}

// end closes the batch and hands its state to the caller, or reports false
// if it had ended already. open is nil unless the batch is small.
func (b *batch) end() (objs map[cas.ID]uint64, open map[uint64]int, fd int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return nil, nil, -1, false
	}
	objs, open, fd = b.objs, b.open, b.fd
	b.ended, b.objs, b.open, b.fd = true, nil, nil, -1
	if b.unlogged || len(b.logged) != len(objs) {
		b.logged = nil
	}
	return objs, open, fd, true
}

// Abort implements cas.Batch.
func (b *batch) Abort() {
	objs, open, fd, ok := b.end()
	if !ok {
		return
	}
	for _, fd := range open {
		unix.Close(fd)
	}
	for id, seq := range objs {
		os.Remove(b.pubPath(id, seq))
	}
	if fd >= 0 {
		unix.Close(fd)
	}
}

type pendingObject struct {
	id  cas.ID
	seq uint64
}

// parallel runs fn(i) for i in [0, n) on n goroutines and returns their
// errors joined. n is at most Options.SmallBatch (or the fan-out
// directories of such a batch).
func parallel(n int, fn func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Commit implements cas.Batch (see Store.NewBatch for the protocol).
func (b *batch) Commit(ctx context.Context) error {
	objs, open, fd, ok := b.end()
	if !ok {
		return errEnded("commit")
	}
	if fd >= 0 {
		defer unix.Close(fd)
	}
	defer func() {
		for _, fd := range open {
			unix.Close(fd)
		}
	}()
	// Id order puts renames into one fan-out directory next to each other
	// and makes a partial publication predictable.
	pending := make([]pendingObject, 0, len(objs))
	for id, seq := range objs {
		pending = append(pending, pendingObject{id, seq})
	}
	objs = nil
	slices.SortFunc(pending, func(a, b pendingObject) int { return bytes.Compare(a.id[:], b.id[:]) })
	// pending[done:] still have temp files when Commit returns.
	done := 0
	defer func() {
		for _, p := range pending[done:] {
			os.Remove(b.pubPath(p.id, p.seq))
		}
	}()

	if err := ctx.Err(); err != nil {
		return fmt.Errorf("batch commit: %w", err)
	}
	if len(pending) == 0 {
		return nil
	}
	s := b.s
	small := open != nil
	if small {
		// 1. and 2., file by file.
		for i, p := range pending {
			if i == 0 || pending[i-1].id[0] != p.id[0] {
				if err := s.ensureFanout(p.id, b.syncDir); err != nil {
					return fmt.Errorf("batch commit: %w", err)
				}
			}
		}
		if err := parallel(len(pending), func(i int) error {
			fd, ok := open[pending[i].seq]
			if !ok {
				return fmt.Errorf("temp file of %s not open: %w", pending[i].id, cas.ErrFailedPrecondition)
			}
			if err := b.fsync(fd); err != nil {
				return fmt.Errorf("fsync %s: %w", b.pubPath(pending[i].id, pending[i].seq), err)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("batch commit: %w", err)
		}
	} else if logged := b.takeLogged(); logged != nil {
		if d := cas.DeferralFrom(ctx); d != nil && b.deferTo(d, logged, pending) {
			// The caller's log makes the objects durable, then Publish
			// does 1. and 3.; the Deferral owns the temp files now.
			done = len(pending)
			return nil
		}
		// 1. and 2. by the redo log: the objects' bytes are durable in it,
		// so nothing else needs a flush (see redolog.go).
		if err := s.log.append(logged); err != nil {
			return fmt.Errorf("batch commit: %w", err)
		}
		for i, p := range pending {
			if i > 0 && pending[i-1].id[0] == p.id[0] || s.fanout[p.id[0]].Load() {
				continue
			}
			if err := os.Mkdir(s.fanoutDir(p.id), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("batch commit: %w", err)
			}
		}
	} else {
		// 1. Fan-out directories, made durable by the flush that follows.
		var made []byte
		for i, p := range pending {
			fan := p.id[0]
			if s.fanout[fan].Load() || (i > 0 && pending[i-1].id[0] == fan) {
				continue
			}
			if err := os.Mkdir(s.fanoutDir(p.id), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("batch commit: %w", err)
			}
			made = append(made, fan)
		}
		// 2. One flush for every temp file and directory, and for the
		// links of earlier batches, whose redo records it retires.
		retire := s.takeRetired()
		if err := b.syncfs(fd); err != nil {
			s.addRetired(retire)
			return fmt.Errorf("batch commit: syncfs %s: %w", s.dir, err)
		}
		removeRetired(retire)
		for _, fan := range made {
			s.fanout[fan].Store(true)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("batch commit: %w", err)
	}
	if !small {
		return b.publishLinks(ctx, pending, &done)
	}

	// 3. Publication of a small batch, by rename.
	s.mu.Lock()
	for _, p := range pending {
		s.inflight[p.id]++
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, p := range pending {
			if s.inflight[p.id]--; s.inflight[p.id] == 0 {
				delete(s.inflight, p.id)
			}
		}
		s.mu.Unlock()
	}()
	var err error
	for _, p := range pending {
		if err = ctx.Err(); err != nil {
			err = fmt.Errorf("batch commit: %w", err)
			break
		}
		rerr := b.rename(b.pubPath(p.id, p.seq), s.Path(p.id))
		if rerr != nil && !errors.Is(rerr, fs.ErrExist) {
			err = fmt.Errorf("batch commit %s: %w", p.id, rerr)
			break
		}
		if rerr != nil {
			// Stored meanwhile by another writer, whose rename the flush
			// below covers too; our copy is redundant.
			os.Remove(b.pubPath(p.id, p.seq))
		}
		done++
	}
	// 4. One flush for every rename, whatever happened above: the renamed
	// objects are visible and must be durable before they leave inflight.
	// The objects stay if it fails: removing them could pull one from
	// under a Put that already found it. Whether they survive a crash is
	// unknown until the next Open fsyncs the fan-out directories.
	var dirs []string
	for i, p := range pending[:done] {
		if i == 0 || pending[i-1].id[0] != p.id[0] {
			dirs = append(dirs, s.fanoutDir(p.id))
		}
	}
	if serr := parallel(len(dirs), func(i int) error { return b.syncDir(dirs[i]) }); serr != nil && err == nil {
		err = fmt.Errorf("batch commit: %w", serr)
	}
	return err
}

// deferTo hands a small batch's objects to d (see cas.Deferral) instead
// of making them durable: publishing them is left to d.Publish, once the
// caller's log holds their records, and dropping them to d.Abort. Until
// then nothing of the batch is under objects/, so whatever a crash leaves
// there is whole or recorded. It reports false if d takes nothing.
func (b *batch) deferTo(d *cas.Deferral, logged []redoObject, pending []pendingObject) bool {
	objs := make([]cas.DeferredObject, len(logged))
	for i, o := range logged {
		objs[i] = cas.DeferredObject{ID: o.id, Data: o.data}
	}
	s := b.s
	publish := func(ctx context.Context) error {
		// 1. Fan-out directories and 3. links, as after the redo log's
		// append: nothing flushed, the records are durable.
		done := 0
		defer func() {
			for _, p := range pending[done:] {
				os.Remove(b.pubPath(p.id, p.seq))
			}
		}()
		for i, p := range pending {
			if i > 0 && pending[i-1].id[0] == p.id[0] || s.fanout[p.id[0]].Load() {
				continue
			}
			if err := os.Mkdir(s.fanoutDir(p.id), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("batch publish: %w", err)
			}
		}
		return b.publishLinks(ctx, pending, &done)
	}
	abort := func() {
		for _, p := range pending {
			os.Remove(b.pubPath(p.id, p.seq))
		}
	}
	return d.Take(objs, publish, abort)
}

// takeLogged hands over the copies of a batch that the redo log can make
// durable (nil if it cannot), after end.
func (b *batch) takeLogged() []redoObject {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.logged
	b.logged = nil
	return l
}

// hashedInode returns the inode of the temp file that large object id was
// hashed into while written.
func (b *batch) hashedInode(id cas.ID) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ino, ok := b.large[id]
	return ino, ok
}

// publishLinks is step 3 of a batch flushed with syncfs: it links every flushed
// temp file into place and queues its name for retirement; *done counts the
// objects handled (the rest still have only a temp file).
func (b *batch) publishLinks(ctx context.Context, pending []pendingObject, done *int) error {
	s := b.s
	linked := map[cas.ID][]string{}
	defer func() { s.addRetired(linked) }()
	for _, p := range pending {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("batch commit: %w", err)
		}
		pub := b.pubPath(p.id, p.seq)
		err := b.link(pub, s.Path(p.id))
		switch {
		case err == nil:
			linked[p.id] = append(linked[p.id], pub)
			if ino, ok := b.hashedInode(p.id); ok {
				// Hashed as written, and now the object's file.
				s.notePublished(p.id, ino)
			}
		case errors.Is(err, fs.ErrExist):
			// Stored meanwhile by another writer, durable already (under
			// its own redo record if it is recent); ours is redundant.
			os.Remove(pub)
		default:
			return fmt.Errorf("batch commit %s: %w", p.id, err)
		}
		*done++
	}
	return nil
}
