package local

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/esf-dev/esf/cas"
)

// DefaultStaleTempAge is the age past which Open removes leftover temp files.
const DefaultStaleTempAge = time.Hour

// Options configures Open. The zero value (or nil) means the defaults.
type Options struct {
	// StaleTempAge is how old a temp file must be for Open to remove it as
	// left by a dead Put. Zero means DefaultStaleTempAge; negative disables
	// the cleanup.
	//
	// A process that opens a store another one writes to (esfd's FUSE
	// server) passes a negative age: its Open then neither removes temp
	// files nor redoes publications (see redoPublications), which only the
	// writer may do, before it writes.
	StaleTempAge time.Duration
	// SmallBatch is the most new objects a batch flushes file by file
	// (fsync of each file, then of each fan-out directory) instead of with
	// two syncfs(2) calls; zero flushes every batch with syncfs. syncfs
	// writes back every dirty page of the file system, so on one shared
	// with heavy writers file by file bounds a small batch's latency; on a
	// quiet one syncfs is cheaper, because each fsync ends with its own
	// flush of the device's cache (see the bench suite's "part: CAS batch"
	// rows, which measure both).
	SmallBatch int
}

func (o *Options) smallBatch() int {
	if o == nil || o.SmallBatch < 0 {
		return 0
	}
	return o.SmallBatch
}

func (o *Options) staleTempAge() time.Duration {
	if o == nil || o.StaleTempAge == 0 {
		return DefaultStaleTempAge
	}
	return o.StaleTempAge
}

// Store is a cas.Store on a local directory.
type Store struct {
	closeOnce sync.Once
	closeErr  error

	dir     string
	objects string
	tmp     string
	// smallBatch is Options.SmallBatch.
	smallBatch int
	// fanout[i] is set once objects/<i as 2 hex> is known to exist durably.
	fanout [256]atomic.Bool

	// inflight counts, per id, Puts between their rename attempt and the
	// fsync that makes the rename durable; a Put that finds such an object
	// already present fsyncs the directory itself before claiming success.
	mu       sync.Mutex
	inflight map[cas.ID]int
	// retire holds, per object, the tmp/pub- names a batch linked into
	// place since the last syncfs: each is the object's redo record until
	// a flush makes its link durable (see NewBatch).
	retire map[cas.ID][]string
	// verified maps large objects to the file identity they were last
	// verified under (see verified.go).
	verified map[cas.ID]fileKey
	// objDir is the objects directory held open for Stat (nil where it
	// cannot be; see objectsDir).
	objDir *objectsDir
	// deletions counts removals of objects, twice each: before the
	// unlink and after it (see Deletions).
	deletions atomic.Uint64
	// log makes small batches durable with one fdatasync (redolog.go);
	// nil in a store opened read-mostly (negative StaleTempAge) or
	// elsewhere than Linux.
	log *redoLog
}

// pubPrefix starts the temp file names that name their object: a batch's
// flushed ones are redo records (see NewBatch and redoPublications).
const pubPrefix = "pub-"

// takeRetired hands over the redo records a flush starting now retires.
func (s *Store) takeRetired() map[cas.ID][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.retire
	s.retire = nil
	return r
}

// addRetired queues redo records for the next flush to retire.
func (s *Store) addRetired(names map[cas.ID][]string) {
	if len(names) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retire == nil {
		s.retire = map[cas.ID][]string{}
	}
	for id, ns := range names {
		s.retire[id] = append(s.retire[id], ns...)
	}
}

// removeRetired unlinks every redo record in names.
func removeRetired(names map[cas.ID][]string) {
	for _, ns := range names {
		for _, n := range ns {
			os.Remove(n)
		}
	}
}

var (
	_ cas.Store           = (*Store)(nil)
	_ cas.DeletionCounter = (*Store)(nil)
)

// Open opens the store in dir, creating it if needed. It fsyncs every
// existing fan-out directory, so objects a crashed process published but
// did not yet make durable are durable before anyone relies on them, and it
// removes stale temp files (see Options.StaleTempAge).
func Open(dir string, o *Options) (*Store, error) {
	if dir == "" {
		return nil, fmt.Errorf("open store: empty directory: %w", cas.ErrInvalidArgument)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	s := &Store{
		dir:      dir,
		objects:  filepath.Join(dir, "objects"),
		tmp:      filepath.Join(dir, "tmp"),
		inflight: map[cas.ID]int{},

		smallBatch: o.smallBatch(),
	}
	for _, d := range []string{s.objects, s.tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		}
	}
	for _, d := range []string{dir, s.objects} {
		if err := syncDir(d); err != nil {
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		}
	}
	for i := range s.fanout {
		d := filepath.Join(s.objects, hex.EncodeToString([]byte{byte(i)}))
		err := syncDir(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		}
		s.fanout[i].Store(true)
	}
	if age := o.staleTempAge(); age > 0 {
		if err := s.redoPublications(); err != nil {
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		}
		if err := s.removeStaleTemps(time.Now().Add(-age)); err != nil {
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		}
		if s.log, err = openRedoLog(s); err != nil {
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		}
	}
	s.objDir = openObjectsDir(s.objects)
	return s, nil
}

// Close releases the store's open files (the redo log's descriptor and the
// objects directory's). Reads still work afterwards; a batch that needs the
// log fails.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.objDir.close()
		s.closeErr = s.log.close()
	})
	return s.closeErr
}

// redoPublications finishes the publication of every object a batch
// flushed under a tmp/pub-<id>-... name and linked into place without
// flushing the link (see NewBatch): where objects/<id> exists (durable now:
// Open fsynced the fan-out directories) the temp name goes; where it does
// not, the link was lost by a crash, or the batch never flushed: the file is
// linked in if its content hashes to id (then its directory fsynced), and
// removed either way.
func (s *Store) redoPublications() error {
	ents, err := os.ReadDir(s.tmp)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name, ok := strings.CutPrefix(e.Name(), pubPrefix)
		if !ok || len(name) < 2*cas.IDSize || !e.Type().IsRegular() {
			continue
		}
		id, err := cas.ParseID(name[:2*cas.IDSize])
		if err != nil {
			continue
		}
		pub := filepath.Join(s.tmp, e.Name())
		if _, err := os.Lstat(s.Path(id)); err == nil {
			if err := os.Remove(pub); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		whole, err := hashesTo(pub, id)
		if err != nil {
			return err
		}
		if whole {
			// A batch's pub- file may never have been flushed (a small
			// batch's bytes were in a redo record, or its Commit never
			// ran): whole as read now, perhaps only in the page cache.
			if err := syncFile(pub); err != nil {
				return err
			}
			if err := s.ensureFanout(id, syncDir); err != nil {
				return err
			}
			if err := os.Link(pub, s.Path(id)); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if err := syncDir(s.fanoutDir(id)); err != nil {
				return err
			}
		}
		if err := os.Remove(pub); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// hashesTo reports whether the file at path holds the bytes of id.
func hashesTo(path string, id cas.ID) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	h := cas.NewHasher()
	if _, err := io.Copy(h, f); err != nil {
		return false, err
	}
	return cas.IDFromHash(h) == id, nil
}

func (s *Store) removeStaleTemps(before time.Time) error {
	ents, err := os.ReadDir(s.tmp)
	if err != nil {
		return err
	}
	for _, e := range ents {
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if info.ModTime().Before(before) {
			if err := os.RemoveAll(filepath.Join(s.tmp, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// Dir returns the store's root directory (absolute).
func (s *Store) Dir() string { return s.dir }

// Path returns the file that holds (or would hold) object id. The file is
// read-only and never rewritten in place, so it can back a FUSE passthrough
// open; content read from it directly is not verified.
func (s *Store) Path(id cas.ID) string {
	h := id.String()
	return filepath.Join(s.objects, h[:2], h[2:])
}

func (s *Store) fanoutDir(id cas.ID) string {
	return filepath.Join(s.objects, id.String()[:2])
}

// Get implements cas.Getter.
func (s *Store) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get %s: %w", id, err)
	}
	f, err := os.Open(s.Path(id))
	if err != nil {
		return nil, objectError("get", id, err)
	}
	if fi, err := f.Stat(); err == nil && fi.Size() >= VerifyMin {
		return &verifiedEnd{ReadCloser: cas.VerifyingReader(id, f), s: s, id: id, fi: fi, size: fi.Size()}, nil
	}
	return cas.VerifyingReader(id, f), nil
}

// Has implements cas.Haser.
func (s *Store) Has(ctx context.Context, id cas.ID) (bool, error) {
	_, err := s.Stat(ctx, id)
	if errors.Is(err, cas.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Stat implements cas.Statter.
func (s *Store) Stat(ctx context.Context, id cas.ID) (cas.Info, error) {
	if err := ctx.Err(); err != nil {
		return cas.Info{}, fmt.Errorf("stat %s: %w", id, err)
	}
	if size, ok, err := s.objDir.statObject(id); ok {
		if err != nil {
			return cas.Info{}, objectError("stat", id, err)
		}
		return cas.Info{ID: id, Size: size}, nil
	}
	fi, err := os.Lstat(s.Path(id))
	if err != nil {
		return cas.Info{}, objectError("stat", id, err)
	}
	return cas.Info{ID: id, Size: fi.Size()}, nil
}

// Delete implements cas.Deleter.
func (s *Store) Delete(ctx context.Context, id cas.ID) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	err := s.removeObject(id)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	// Its redo record would keep the space and could bring it back.
	s.mu.Lock()
	names := s.retire[id]
	delete(s.retire, id)
	s.mu.Unlock()
	for _, n := range names {
		os.Remove(n)
	}
	return nil
}

// removeObject unlinks the object id, counting the removal (see
// Deletions), whether or not it was there.
func (s *Store) removeObject(id cas.ID) error {
	s.deletions.Add(1)
	defer s.deletions.Add(1)
	return os.Remove(s.Path(id))
}

// Deletions implements cas.DeletionCounter: it moves before any object
// leaves objects/ (Delete, or Open's redo of a damaged one) and again after
// the unlink. So a count read before a check that found an object present
// is still current only if no removal took effect after the check, and one
// that is still current says no removal has even started since: the
// object is there. It counts what this Store removes, not what another
// process removes from the same directory (none does: only the daemon
// that owns a store collects it).
func (s *Store) Deletions() (uint64, bool) { return s.deletions.Load(), true }

// objectError wraps err from touching the file of id, mapping a missing file
// to cas.ErrNotFound.
func objectError(op string, id cas.ID, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s %s: %w", op, id, cas.ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, id, err)
}

// Walk implements cas.Walker. It lists one fan-out directory at a time, in
// batches, so memory stays bounded however many objects there are.
func (s *Store) Walk(ctx context.Context, fn func(cas.Info) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("walk: %w", err)
	}
	fans, err := os.ReadDir(s.objects)
	if err != nil {
		return fmt.Errorf("walk: %w", err)
	}
	for _, fan := range fans {
		name := fan.Name()
		if !fan.IsDir() || len(name) != 2 || !isLowerHex(name) {
			continue
		}
		if err := s.walkFanout(ctx, name, fn); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) walkFanout(ctx context.Context, prefix string, fn func(cas.Info) error) error {
	d, err := os.Open(filepath.Join(s.objects, prefix))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("walk: %w", err)
	}
	defer d.Close()
	for {
		ents, err := d.ReadDir(512)
		for _, e := range ents {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("walk: %w", err)
			}
			name := e.Name()
			if len(name) != 2*cas.IDSize-2 || !e.Type().IsRegular() {
				continue
			}
			id, perr := cas.ParseID(prefix + name)
			if perr != nil || !isLowerHex(name) {
				continue
			}
			fi, ierr := e.Info()
			if errors.Is(ierr, fs.ErrNotExist) {
				continue // deleted since the listing
			}
			if ierr != nil {
				return fmt.Errorf("walk: %w", ierr)
			}
			if err := fn(cas.Info{ID: id, Size: fi.Size()}); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("walk: %w", err)
		}
	}
}

// isLowerHex reports whether s is lowercase hex, the only spelling Path
// produces: an upper-case twin would be a stray file, not a second copy.
func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// bufSize is both the copy chunk and the threshold under which Put hashes
// the whole object before creating any file.
const bufSize = 256 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// Put implements cas.Putter.
func (s *Store) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp

	n, eof, err := fill(ctx, r, buf)
	if err != nil {
		return cas.Info{}, false, fmt.Errorf("put: %w", err)
	}
	var info cas.Info
	var written os.FileInfo // the temp file as hashed, for a large object
	if eof {
		// The whole object is in buf: if it is already stored, no file is
		// ever created.
		info = cas.Info{ID: cas.Sum(buf[:n]), Size: int64(n)}
		if done, err := s.existing(info.ID); err != nil {
			return cas.Info{}, false, err
		} else if done {
			return info, false, nil
		}
	}
	w, err := s.newTemp()
	if err != nil {
		return cas.Info{}, false, fmt.Errorf("put: %w", err)
	}
	defer w.discard()
	if eof {
		if _, err := w.f.Write(buf[:n]); err != nil {
			return cas.Info{}, false, fmt.Errorf("put: %w", err)
		}
	} else {
		h := cas.NewHasher()
		size, err := stream(ctx, r, buf[:n], h, int(w.f.Fd()), func(p []byte) error {
			_, err := w.f.Write(p)
			return err
		})
		if err != nil {
			return cas.Info{}, false, fmt.Errorf("put: %w", err)
		}
		info = cas.Info{ID: cas.IDFromHash(h), Size: size}
		written, _ = w.f.Stat()
		// Known only now for a large object: skip the fsync if it is stored.
		if done, err := s.existing(info.ID); err != nil {
			return cas.Info{}, false, err
		} else if done {
			return info, false, nil
		}
	}
	created, err := s.commit(ctx, w, info.ID)
	if err != nil {
		return cas.Info{}, false, fmt.Errorf("put %s: %w", info.ID, err)
	}
	if created && written != nil {
		// The file hashed while written is the object's.
		if st, ok := written.Sys().(*syscall.Stat_t); ok {
			s.notePublished(info.ID, st.Ino)
		}
	}
	return info, created, nil
}

// fill reads r into buf until buf is full or r ends, checking ctx before
// every read so a cancelled Put stops within one chunk.
func fill(ctx context.Context, r io.Reader, buf []byte) (n int, eof bool, err error) {
	for n < len(buf) {
		if err := ctx.Err(); err != nil {
			return n, false, err
		}
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF {
			return n, true, nil
		}
		if err != nil {
			return n, false, err
		}
	}
	return n, false, nil
}

// existing reports whether id is already stored, after making sure that, if
// it is, it is durable.
func (s *Store) existing(id cas.ID) (bool, error) {
	if _, err := os.Lstat(s.Path(id)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("put %s: %w", id, err)
	}
	s.mu.Lock()
	pending := s.inflight[id] > 0
	s.mu.Unlock()
	if pending {
		if err := syncDir(s.fanoutDir(id)); err != nil {
			return true, fmt.Errorf("put %s: %w", id, err)
		}
	}
	return true, nil
}

type tempFile struct {
	f    *os.File
	name string
	done bool // published or already removed
}

func (s *Store) newTemp() (*tempFile, error) {
	f, err := os.CreateTemp(s.tmp, "put-*")
	if err != nil {
		return nil, err
	}
	return &tempFile{f: f, name: f.Name()}, nil
}

// discard removes the temp file unless it was published. Safe to call twice.
func (w *tempFile) discard() {
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
	if !w.done {
		os.Remove(w.name)
		w.done = true
	}
}

// commit makes the temp file durable and read-only and publishes it as id.
// It reports whether this call created the object.
func (s *Store) commit(ctx context.Context, w *tempFile, id cas.ID) (bool, error) {
	if err := w.f.Chmod(0o444); err != nil {
		return false, err
	}
	if err := w.f.Sync(); err != nil {
		return false, err
	}
	if err := w.f.Close(); err != nil {
		w.f = nil
		return false, err
	}
	w.f = nil
	// Last chance to give up cleanly: past the rename the object exists.
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := s.ensureFanout(id, syncDir); err != nil {
		return false, err
	}
	s.mu.Lock()
	s.inflight[id]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.inflight[id]--; s.inflight[id] == 0 {
			delete(s.inflight, id)
		}
		s.mu.Unlock()
	}()
	created := true
	if err := renameNoReplace(w.name, s.Path(id)); err != nil {
		if !errors.Is(err, fs.ErrExist) {
			return false, err
		}
		// Lost a race with another Put of the same bytes, which may not have
		// fsynced yet; the fsync below covers its rename.
		created = false
	} else {
		w.done = true
	}
	if err := syncDir(s.fanoutDir(id)); err != nil {
		// The object stays: removing it could pull it from under a Put
		// that already reported it stored. Whether it survives a crash is
		// unknown until the next Open fsyncs the fan-out directories.
		return false, err
	}
	return created, nil
}

// ensureFanout creates the fan-out directory of id on first use and makes
// its creation durable with sync (syncDir, or a test's seam).
func (s *Store) ensureFanout(id cas.ID, sync func(dir string) error) error {
	i := id[0]
	if s.fanout[i].Load() {
		return nil
	}
	err := os.Mkdir(s.fanoutDir(id), 0o755)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// Also when it existed: its creator may not have fsynced the parent yet.
	if err := sync(s.objects); err != nil {
		return err
	}
	s.fanout[i].Store(true)
	return nil
}

// syncFile fsyncs the file at path.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
