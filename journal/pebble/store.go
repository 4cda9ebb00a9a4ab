package pebble

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
	"github.com/esf-dev/esf/journal/internal/kvutil"
)

// Options configure a Store. The zero value is valid: every field has a
// default.
type Options struct {
	// FS is the filesystem pebble writes to; default the OS (vfs.Default).
	// Tests pass vfs.NewMem() or vfs.NewCrashableMem().
	FS vfs.FS
	// CacheSize is the block cache in bytes; default 32 MiB.
	CacheSize int64
	// MemTableSize is the size of one memtable in bytes; default 4 MiB.
	MemTableSize uint64
	// Now is the clock behind Reader.Now; default time.Now.
	Now func() time.Time
	// Logger receives pebble's log at Debug (info) and Error level;
	// default discards it.
	Logger *slog.Logger
	// Failpoint is evaluated at the journal.Failpoint* boundaries of every
	// Update; a non-nil error aborts it there. Default failpoint.Inject.
	Failpoint func(name string) error
}

const (
	defaultCacheSize    = 32 << 20
	defaultMemTableSize = 4 << 20
	// separateValuesFrom is the size from which a value goes to a blob
	// file: a data block's worth, so records (a node is ~430 bytes) stay
	// in the tables that index them.
	separateValuesFrom = 4 << 10
)

// Validate checks o and fills in defaults.
func (o *Options) Validate() error {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.CacheSize < 0 {
		return fmt.Errorf("journal options: negative cache size: %w", journal.ErrInvalidArgument)
	}
	if o.CacheSize == 0 {
		o.CacheSize = defaultCacheSize
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = defaultMemTableSize
	}
	if o.MemTableSize < 1<<20 {
		return fmt.Errorf("journal options: memtable of %d bytes is below 1 MiB: %w", o.MemTableSize, journal.ErrInvalidArgument)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Failpoint == nil {
		o.Failpoint = failpoint.Inject
	}
	return nil
}

// Store is the pebble journal.Store.
type Store struct {
	db     *pebble.DB
	opts   Options
	notify kvutil.Broadcaster

	// writer is the one-slot writer lock; a channel so that waiting for it
	// can give up when the context ends.
	writer chan struct{}
	// closeMu is held shared by every transaction and exclusively by Close,
	// so pebble is never closed under a live snapshot or batch.
	closeMu sync.RWMutex
	closed  bool

	// Group commit (see the package doc). issued numbers the commits in
	// the order they were applied (under the writer lock, before the
	// batch becomes visible); durable is the highest number up to which
	// every commit's WAL sync has finished. Both only grow.
	issued  atomic.Uint64
	durable atomic.Uint64
	dmu     sync.Mutex
	synced  map[uint64]bool // commits synced out of order, above durable
	advance chan struct{}   // closed (and replaced) when durable grows or syncErr is set
	syncErr error           // a failed WAL sync: the store refuses all further work
}

var _ journal.Store = (*Store)(nil)

// Open opens (creating if needed) the journal in dir.
func Open(dir string, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	po := &pebble.Options{
		FS:           opts.FS,
		CacheSize:    opts.CacheSize,
		MemTableSize: opts.MemTableSize,
		// Pinned rather than FormatNewest, so a pebble upgrade never
		// rewrites the on-disk format unasked. It includes WAL sync chunks,
		// which let recovery tell a torn WAL tail from corruption.
		FormatMajorVersion: pebble.FormatValueSeparation,
		Logger:             slogAdapter{opts.Logger},
	}
	// Bloom filters on every level (later levels inherit L0's): most
	// transactions look up keys that do not exist yet (a new node id, an
	// idempotency key seen for the first time), and without a filter each
	// such Get searches the index of every overlapping table of every
	// level, which grows with the graph.
	po.Levels[0].FilterPolicy = bloom.FilterPolicy(10)
	// Large values (the recorded result of a fork -n 2000 is ~0.9 MB) live
	// in blob files, and a table holds a reference to them. A Get of a key
	// that is not there seeks into the data block where it would be, and
	// the bottom level's filters are not consulted on a Get: without
	// separation, checking a fresh idempotency key next to one big result
	// decompressed the whole result (0.4-1 ms a Get on a 1M-node journal).
	// Compactions also rewrite only the reference, not the value.
	po.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
		return pebble.ValueSeparationPolicy{
			Enabled:               true,
			MinimumSize:           separateValuesFrom,
			MaxBlobReferenceDepth: 10,
			RewriteMinimumAge:     10 * time.Minute,
			TargetGarbageRatio:    0.25,
		}
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("open journal %s: %w", dir, err)
	}
	if err := checkSchema(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open journal %s: %w", dir, err)
	}
	return &Store{db: db, opts: opts, writer: make(chan struct{}, 1), synced: map[uint64]bool{}, advance: make(chan struct{})}, nil
}

func checkSchema(db *pebble.DB) error {
	v, closer, err := db.Get(kvutil.SchemaKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return db.Set(kvutil.SchemaKey, kvutil.SchemaValue(), pebble.Sync)
	}
	if err != nil {
		return mapErr(err)
	}
	defer closer.Close()
	return kvutil.CheckSchema(v)
}

// View implements journal.Store.
func (s *Store) View(ctx context.Context, fn func(r journal.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return journal.ErrClosed
	}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	// The snapshot may hold commits whose WAL sync is still running (the
	// writer lock is released before it): wait for them, so nothing is
	// read that a crash could still take back. Loaded after the snapshot
	// was taken, issued counts every commit it can see.
	if err := s.waitDurable(ctx, s.issued.Load()); err != nil {
		return err
	}
	r := &reader{ctx: ctx, src: snap, now: s.now()}
	defer r.end()
	return fn(r)
}

// Update implements journal.Store.
func (s *Store) Update(ctx context.Context, fn func(tx journal.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case s.writer <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	locked := true
	unlock := func() {
		if locked {
			locked = false
			<-s.writer
		}
	}
	defer unlock()
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return journal.ErrClosed
	}
	if err := s.opts.Failpoint(journal.FailpointUpdateBegin); err != nil {
		return err
	}

	b := s.db.NewIndexedBatch()
	defer b.Close()
	t := &tx{reader: reader{ctx: ctx, src: b, now: s.now()}, b: b}
	err := fn(t)
	t.end()
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.Empty() {
		// fn may have read commits still being synced; what it returns
		// must not outlive a crash either.
		k := s.issued.Load()
		unlock()
		return s.waitDurable(ctx, k)
	}
	if err := s.opts.Failpoint(journal.FailpointUpdateBeforeCommit); err != nil {
		return err
	}
	if err := s.failed(); err != nil {
		return err
	}
	// Apply the batch (visible from here on) and let the next transaction
	// in while the WAL sync runs: pebble's log writer syncs every commit
	// queued meanwhile with one fdatasync.
	k := s.issued.Add(1)
	if err := s.db.ApplyNoSyncWait(b, pebble.Sync); err != nil {
		// pebble fails a commit here only when its own state is broken
		// (the batch may sit in its pending queue for good): no later
		// commit could become durable, so the failure is sticky.
		s.markSynced(k, err)
		return fmt.Errorf("journal commit: %w", mapErr(err))
	}
	unlock()
	serr := b.SyncWait()
	s.markSynced(k, serr)
	if serr != nil {
		return fmt.Errorf("journal commit: %w", mapErr(serr))
	}
	// Return only once every commit this one could have read is durable
	// too (they synced before it in the WAL, but each waits for its own).
	if err := s.waitDurable(context.WithoutCancel(ctx), k); err != nil {
		return fmt.Errorf("journal commit: %w", err)
	}
	if t.appends.Appended() {
		s.notify.Broadcast()
	}
	return s.opts.Failpoint(journal.FailpointUpdateAfterCommit)
}

// markSynced records that commit k's WAL sync finished (err nil) or
// failed (then every later transaction fails with it), and advances durable over every commit synced in a row.
func (s *Store) markSynced(k uint64, err error) {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	if err != nil {
		if s.syncErr == nil {
			s.syncErr = fmt.Errorf("journal commit failed, the journal must be reopened: %w", err)
			close(s.advance)
			s.advance = make(chan struct{})
		}
		return
	}
	d := s.durable.Load()
	if k <= d {
		return
	}
	s.synced[k] = true
	for s.synced[d+1] {
		delete(s.synced, d+1)
		d++
	}
	if d != s.durable.Load() {
		s.durable.Store(d)
		close(s.advance)
		s.advance = make(chan struct{})
	}
}

// failed returns the sticky error of a failed WAL sync: after one, the
// log's state on disk is unknown (a failed fsync may have dropped the
// dirty pages it could not write), so no transaction may build on it.
func (s *Store) failed() error {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	return s.syncErr
}

// waitDurable waits until every commit up to k is durable.
func (s *Store) waitDurable(ctx context.Context, k uint64) error {
	for {
		if s.durable.Load() >= k {
			return nil
		}
		s.dmu.Lock()
		ch, err := s.advance, s.syncErr
		s.dmu.Unlock()
		if err != nil {
			return err
		}
		if s.durable.Load() >= k {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Notify implements journal.Store.
func (s *Store) Notify() <-chan struct{} { return s.notify.Wait() }

// Close implements journal.Store.
func (s *Store) Close() error {
	s.writer <- struct{}{}
	defer func() { <-s.writer }()
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.notify.Close()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close journal: %w", err)
	}
	return nil
}

// Metrics returns pebble's metrics, for the daemon's status and benchmarks.
func (s *Store) Metrics() (*pebble.Metrics, error) {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return nil, journal.ErrClosed
	}
	return s.db.Metrics(), nil
}

func (s *Store) now() time.Time { return s.opts.Now().UTC() }

// source is what a pebble snapshot and an indexed batch have in common.
type source interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *pebble.IterOptions) (*pebble.Iterator, error)
}

type reader struct {
	ctx   context.Context
	src   source
	now   time.Time
	ended bool
}

var errEnded = fmt.Errorf("journal transaction used after it ended: %w", journal.ErrFailedPrecondition)

func (r *reader) end() { r.ended = true }

func (r *reader) Get(key []byte) ([]byte, error) {
	if r.ended {
		return nil, errEnded
	}
	v, closer, err := r.src.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, notFound(key)
	}
	if err != nil {
		return nil, fmt.Errorf("get %q: %w", key, mapErr(err))
	}
	out := append([]byte(nil), v...)
	return out, closer.Close()
}

// notFound is the error of a Get of an absent key. Many transactions look
// up keys that do not exist yet (a fresh idempotency key, a new node id),
// so it formats its message only when asked (issue 21: fmt.Errorf here was
// a tenth of a fork's allocations).
type notFound []byte

func (k notFound) Error() string { return fmt.Sprintf("key %q: %v", []byte(k), journal.ErrNotFound) }
func (k notFound) Unwrap() error { return journal.ErrNotFound }

// ctxCheckEvery is how many keys a scan reads between context checks.
const ctxCheckEvery = 64

func (r *reader) Scan(start, end []byte, fn func(key, value []byte) error) (err error) {
	if r.ended {
		return errEnded
	}
	if err := r.ctx.Err(); err != nil {
		return err
	}
	if len(start) == 0 {
		// pebble's invariant checks (on under -race) index a seek key's
		// first byte; no lower bound means the same as the empty key.
		start = nil
	}
	it, err := r.src.NewIter(&pebble.IterOptions{LowerBound: start, UpperBound: end})
	if err != nil {
		return fmt.Errorf("scan: %w", mapErr(err))
	}
	defer func() {
		if cerr := it.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("scan: %w", mapErr(cerr))
		}
	}()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		if n++; n%ctxCheckEvery == 0 {
			if err := r.ctx.Err(); err != nil {
				return err
			}
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("scan %q: %w", it.Key(), mapErr(err))
		}
		if err := fn(it.Key(), v); err != nil {
			if errors.Is(err, journal.ErrStop) {
				return nil
			}
			return err
		}
	}
	return nil
}

func (r *reader) Events(after uint64, fn func(ev journal.Event) error) error {
	return kvutil.ScanEvents(r.Scan, after, fn)
}

func (r *reader) LastSeq() (uint64, error) {
	if r.ended {
		return 0, errEnded
	}
	return kvutil.LastSeq(r.Get)
}

func (r *reader) Now() time.Time { return r.now }

type tx struct {
	reader
	b       *pebble.Batch
	appends kvutil.Appends
}

func (t *tx) Put(key, value []byte) error {
	if err := kvutil.CheckPut(key, value); err != nil {
		return err
	}
	return t.RawPut(key, value)
}

// RawPut writes without the reserved-prefix check, for kvutil's event log.
func (t *tx) RawPut(key, value []byte) error {
	if t.ended {
		return errEnded
	}
	return mapErr(t.b.Set(key, value, nil))
}

func (t *tx) Delete(key []byte) error {
	if t.ended {
		return errEnded
	}
	if err := kvutil.CheckDelete(key); err != nil {
		return err
	}
	return mapErr(t.b.Delete(key, nil))
}

func (t *tx) AppendEvent(ev journal.Event) error {
	if t.ended {
		return errEnded
	}
	return t.appends.Append(t, t.now, ev)
}

func (t *tx) Events(after uint64, fn func(ev journal.Event) error) error {
	return t.appends.Events(t.Scan, after, fn)
}

func (t *tx) LastSeq() (uint64, error) {
	if t.ended {
		return 0, errEnded
	}
	return t.appends.LastSeq(t.Get)
}

// mapErr gives pebble's corruption errors our class.
func mapErr(err error) error {
	if err != nil && errors.Is(err, pebble.ErrCorruption) {
		return fmt.Errorf("%w: %w", journal.ErrCorrupt, err)
	}
	return err
}

// slogAdapter routes pebble's logger to slog.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Infof(format string, args ...any) {
	a.l.Debug(fmt.Sprintf(format, args...), "component", "pebble")
}

func (a slogAdapter) Errorf(format string, args ...any) {
	a.l.Error(fmt.Sprintf(format, args...), "component", "pebble")
}

// Fatalf is how pebble reports a broken invariant of its own files; it must
// not return, so after logging this panics, as pebble's default logger exits.
func (a slogAdapter) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	a.l.Error(msg, "component", "pebble", "fatal", true)
	panic("pebble: " + msg)
}
