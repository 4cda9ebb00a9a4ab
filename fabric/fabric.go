package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/cas/tier"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/fusefs"
	"github.com/esf-dev/esf/gc"
	"github.com/esf-dev/esf/ingest"
	"github.com/esf-dev/esf/journal"
	journalpebble "github.com/esf-dev/esf/journal/pebble"
	"github.com/esf-dev/esf/mounter"
	"github.com/esf-dev/esf/wasi"
)

// Version is the version esfd reports; the Makefile sets it with -ldflags -X.
var Version = "dev"

// Options configures Open. StateDir is required; everything else has a
// default.
type Options struct {
	// StateDir holds all of the daemon's durable state (see the package doc
	// for the layout). It is created (mode 0700) if missing.
	StateDir string
	// Logger receives operational logs. Default: discard. Only cmd/ builds a
	// handler; fabric never touches the global logger.
	Logger *slog.Logger
	// Store configures the local object store.
	Store *local.Options
	// CAS, if set, is the content store instead of the local store under
	// <state>/cas (Store is then ignored): cas/mem for logic tests, a
	// remote store for tests that prove the FRs on one. The caller closes
	// it, if it needs closing, after Close. It cannot be combined with
	// Remote, whose cache is the local store.
	CAS cas.Store
	// Journal configures the state plane (pebble under <state>/journal).
	Journal journalpebble.Options
	// JournalStore, if set, is the state plane instead of pebble (the
	// etcd journal several workers share); Close closes it.
	JournalStore journal.Store
	// Remote, if set, is the remote content store (cas/s3): the local store
	// becomes a verified cache in front of it and every write goes through
	// to it before it is answered (cas/tier).
	Remote tier.Remote
	// CacheSize bounds the local store's bytes when Remote is set (LRU;
	// objects of live attempts stay); zero leaves it unbounded.
	CacheSize int64
	// RemoteAsync acknowledges writes once committed locally and queued
	// (durably, in <state>/upload-queue) for upload, instead of once in the
	// remote; the queue survives restarts.
	RemoteAsync bool
	// ProjectionCommand runs the FUSE projection server as a child process
	// (esfd passes itself with "fuse-server"). Empty serves the projection
	// in-process, which only tests should do: a process that serves a FUSE
	// mount must not also run executors on it.
	ProjectionCommand []string
	// Worker names this daemon in attempt runtime records; default the
	// host name.
	Worker string
	// Now is the clock for leases; default time.Now.
	Now func() time.Time
	// MaxLiveAttempts and MaxMemoryBytes bound the attempts this daemon
	// runs at once (FR-08); zero means unbounded.
	MaxLiveAttempts int
	MaxMemoryBytes  int64
	// DefaultLimits are a runc attempt's container limits where its
	// activation names none (field by field; zero: unlimited). The memory
	// limit is also what any attempt without its own reserves against
	// MaxMemoryBytes (DefaultAttemptMemory when this is zero too), so the
	// quota counts what the cgroup enforces.
	DefaultLimits executor.Limits
	// DefaultDiskBytes is the disk limit of an attempt's delta when its
	// activation sets none; zero: deltas are not limited (and an
	// activation that asks for a limit is refused). With a limit the
	// deltas live in a disk pool (delta.Pool) that the first mount of a
	// delta mounts on the state dir's attempts directory.
	DefaultDiskBytes int64
	// Executor runs runc attempts; nil refuses them (unsupported).
	Executor executor.Executor
	// IDMap, if set, is the user namespace the Executor runs containers
	// in (the same range): a runc attempt's root is then mounted with its
	// ids shifted into it (delta.IDMap), so the container's root owns
	// what the tree records as root's, while the upper directory, and so
	// every seal, keeps the sandbox's own ids. The caller closes it after
	// Close.
	IDMap *delta.IDMap
	// WASI runs modules for wasi attempts; nil refuses them.
	WASI *wasi.Runtime
	// GeneratedKeyTTL is how long the result of a mutation whose
	// idempotency key was made up (CallInfo.KeyGenerated) stays replayable;
	// ExpireIdempotencyKeys deletes it after that. Default 24 hours;
	// negative keeps every result for ever. Results under a caller's own
	// key are always kept.
	GeneratedKeyTTL time.Duration
	// Cluster, with a JournalStore on etcd, is this daemon's registration
	// as one of the workers of a shared graph (cluster.go). Its id is the
	// worker name (Worker is ignored). Close closes the registration
	// (revoking its lease) before the journal.
	Cluster *Cluster
	// StateLock is the state dir's lock when the caller took it before
	// Open (LockState: to register Cluster under the dir's identity while
	// it holds it); Open takes it over and releases it when it fails or
	// closes. Nil: Open takes the lock itself.
	StateLock *StateLock
	// ContainerMounts are bind mounts every runc container of this daemon
	// gets (operator configuration, never an API field: a caller must not
	// be able to mount host paths).
	ContainerMounts []executor.Mount
	// Mounter mounts the projection, attempts' deltas and read-only views
	// and walks a delta for a seal; default the real one (FUSE, overlayfs,
	// bind mounts: root only). mounter/fake serves logic tests.
	Mounter mounter.Mounter
}

// DefaultGeneratedKeyTTL is Options.GeneratedKeyTTL's default.
const DefaultGeneratedKeyTTL = 24 * time.Hour

// Validate reports whether o can be opened, without touching the disk.
func (o *Options) Validate() error {
	if o.StateDir == "" {
		return fmt.Errorf("fabric options: empty state dir: %w", errdefs.ErrInvalidArgument)
	}
	if o.CAS != nil && o.Remote != nil {
		return fmt.Errorf("fabric options: a content store (CAS) and a remote: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Worker == "" {
		o.Worker, _ = os.Hostname()
	}
	if o.Mounter == nil {
		o.Mounter = mounter.New()
	}
	if o.GeneratedKeyTTL == 0 {
		o.GeneratedKeyTTL = DefaultGeneratedKeyTTL
	}
	if o.Journal.Now == nil {
		o.Journal.Now = o.Now
	}
	if o.Journal.Logger == nil {
		o.Journal.Logger = o.Logger
	}
	return o
}

// Fabric is the daemon's composition root: every operation of the API is a
// method of it. Other files of this package add operations; they reach the
// parts through the fields below.
type Fabric struct {
	opts     Options
	log      *slog.Logger
	stateDir string
	tmpDir   string
	// statCache lets an import of a directory skip the files an earlier
	// import read and that did not change since (ingest.StatCache).
	statCache *ingest.StatCache

	lock *os.File // flock on <state>/lock, held until Close

	// corruptOff is how far ReportCorrupt has read the projection's
	// corrupt blob log.
	corruptMu  sync.Mutex
	corruptOff int64

	// local is the disk store under <state>/cas (nil with Options.CAS).
	local *local.Store
	// tier is the verified cache over Options.Remote, or nil.
	tier *tier.Store
	// counting keeps the object tally of Status; store, the GC tracker
	// around it, is what every operation reads and writes through.
	counting *countingStore
	store    *gc.Tracker

	journal journal.Store
	// redo holds the seals' redo records in the journal until a flush of
	// the store retires them; nil unless the journal is pebble and the
	// store local without a remote (storeredo.go).
	redo       *storeRedo
	ids        *journal.IDGen
	projection *projection
	// mounter is Options.Mounter.
	mounter mounter.Mounter
	worker  string
	now     func() time.Time
	// mountLocks serialise, per mount point, mounting and unmounting an
	// attempt's root (lockMount): the check that nothing is mounted there
	// and the mount that follows are one step. Different roots mount and
	// unmount in parallel: an overlay's mount spends most of its time
	// looking up the projected lower root through FUSE, outside the
	// kernel's mount lock, and a global lock made concurrent activations
	// and seals wait for each other's (issue 21, rollout throughput).
	// mountsMu is held shared by every mount and unmount (in lockMount)
	// and exclusively by whoever needs the mount table still for a while
	// (a test reading mountinfo, which comes a page at a time).
	mountsMu     sync.RWMutex
	mountLocksMu sync.Mutex
	mountLocks   map[string]*attemptLock
	// attemptLocks serialise, per attempt id, what acts on an attempt's
	// mount and container outside a journal transaction: an activation's
	// mount and container start (its replays' too) against a failure's,
	// release's or seal's unmount, commit and deletion (lockAttempt).
	attemptLocksMu sync.Mutex
	attemptLocks   map[string]*attemptLock
	// sealing holds the attempts a Suspend of this process is sealing:
	// the claim that keeps a second seal or a release off them (an
	// attempt without an executor is quiescing only in memory until its
	// seal commits; see Suspend).
	sealMu  sync.Mutex
	sealing map[string]bool
	// reap queues ended attempts' directories for the reaper goroutine
	// (Open to Close); reaping counts those not deleted yet. reapMu
	// guards sends against Close closing reap (reapClosed).
	reap       chan string
	reapMu     sync.Mutex
	reapClosed bool
	reaping    sync.WaitGroup
	reaperDone sync.WaitGroup
	quota      *quota
	// bg tracks goroutines that start queued attempts; Close waits.
	bg      sync.WaitGroup
	gcStats gcTotals
	exec    executor.Executor
	wasm    *wasi.Runtime
	// pool holds the deltas when DefaultDiskBytes is set, made (or
	// adopted) by the first mount that needs it (ensurePool), as the
	// projection is: a daemon that runs no attempt mounts nothing.
	// poolFailed: it could not be made; deltas are then not limited.
	// Both under poolMu.
	poolMu     sync.Mutex
	pool       *delta.Pool
	poolFailed bool
	// provKey authenticates provenance records this daemon writes.
	provKey []byte

	// The initial object tally runs in the background from Open to its end
	// or to Close; cancelScan stops it and scanDone waits for it.
	cancelScan context.CancelFunc
	scanDone   sync.WaitGroup

	// cluster is the membership (nil on a graph of its own); its loop
	// runs from Open to Close.
	cluster     *Cluster
	rgc         remoteGC // the remote collection's record (remotegc.go)
	stopCluster context.CancelFunc
	clusterDone sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating if needed) the state in opts.StateDir. Only one
// process may hold a state dir: a second Open fails with
// errdefs.ErrFailedPrecondition.
func Open(ctx context.Context, opts Options) (*Fabric, error) {
	f, err := open(ctx, opts)
	if err != nil && opts.StateLock != nil {
		opts.StateLock.Close()
	}
	return f, err
}

func open(ctx context.Context, opts Options) (*Fabric, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	stateDir, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("open state %s: %w", opts.StateDir, err)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("open state %s: %w", stateDir, err)
	}
	var lock *os.File
	if sl := opts.StateLock; sl != nil {
		if sl.dir != stateDir || sl.f == nil {
			return nil, fmt.Errorf("open state %s: the state lock given is of %s: %w", stateDir, sl.dir, errdefs.ErrInvalidArgument)
		}
		lock = sl.f
	} else if lock, err = lockStateDir(stateDir); err != nil {
		return nil, err
	}
	f := &Fabric{
		attemptLocks: map[string]*attemptLock{},
		mountLocks:   map[string]*attemptLock{},
		opts:         opts,
		log:          opts.Logger,
		stateDir:     stateDir,
		tmpDir:       filepath.Join(stateDir, "tmp"),
		lock:         lock,
		mounter:      opts.Mounter,
		statCache:    ingest.NewStatCache(0),
	}
	// ownJournal is the journal Open opened (not one it was given).
	var ownJournal journal.Store
	// fail closes what Open opened so far, the reverse of Close's order.
	fail := func(err error) (*Fabric, error) {
		if ownJournal != nil {
			ownJournal.Close()
		}
		if f.tier != nil {
			f.tier.Close() // stops its uploader
		}
		if f.local != nil {
			f.local.Close()
		}
		lock.Close()
		return nil, err
	}
	// Private whatever modes it was created with (see statedir.go).
	if err := makePrivate(stateDir); err != nil {
		return fail(fmt.Errorf("open state %s: %w", stateDir, err))
	}
	// Whatever is in tmp was left by a previous holder of the lock (imports
	// stage there); nobody else uses it.
	if err := os.RemoveAll(f.tmpDir); err != nil {
		return fail(fmt.Errorf("open state %s: clean tmp: %w", stateDir, err))
	}
	if err := os.MkdirAll(f.tmpDir, 0o700); err != nil {
		return fail(fmt.Errorf("open state %s: %w", stateDir, err))
	}
	base := opts.CAS
	if base == nil {
		if f.local, err = local.Open(filepath.Join(stateDir, "cas"), opts.Store); err != nil {
			return fail(fmt.Errorf("open state %s: %w", stateDir, err))
		}
		base = f.local
	}
	if opts.Remote != nil {
		// f.journal is set below, before any operation can evict.
		topts := tier.Options{Local: f.local, Remote: opts.Remote, Logger: f.log, CacheSize: opts.CacheSize, Pinned: f.pinnedRoots}
		if opts.RemoteAsync {
			topts.QueueDir = filepath.Join(stateDir, "upload-queue")
		}
		if f.tier, err = tier.New(topts); err != nil {
			return fail(fmt.Errorf("open state %s: %w", stateDir, err))
		}
		base = f.tier
	}
	f.counting = newCountingStore(base)
	// The GC tracker is outermost: it sees every write and every dedup
	// hit, and its deletes still pass through the tally.
	f.store = gc.NewTracker(f.counting)
	f.now, f.worker = opts.Now, opts.Worker
	f.quota = newQuota(opts.MaxLiveAttempts, opts.MaxMemoryBytes)
	f.exec = opts.Executor
	if pl, ok := f.exec.(executor.PoolLimiter); ok {
		f.quota.room = pl.SetPoolLimit
		f.quota.changed()
	}
	f.wasm = opts.WASI
	f.ids = journal.NewIDGen(opts.Now, nil)
	if f.journal = opts.JournalStore; f.journal == nil {
		j, err := journalpebble.Open(filepath.Join(stateDir, "journal"), opts.Journal)
		if err != nil {
			return fail(fmt.Errorf("open state %s: %w", stateDir, err))
		}
		f.journal, ownJournal = j, j
	}
	if f.local != nil && opts.JournalStore == nil {
		// Before anything reads the store (the tally's scan, the
		// projection, any operation).
		if err := f.replayStoreRedo(ctx); err != nil {
			return fail(fmt.Errorf("open state %s: %w", stateDir, err))
		}
		if opts.Remote == nil {
			f.redo = &storeRedo{}
		}
	}
	if opts.Cluster != nil {
		f.cluster = opts.Cluster
		f.worker = opts.Cluster.Registration.ID()
		f.provKey, err = sharedKey(ctx, f.journal)
	} else {
		f.provKey, err = loadKey(filepath.Join(stateDir, "provenance.key"))
	}
	if err != nil {
		return fail(fmt.Errorf("open state %s: %w", stateDir, err))
	}
	f.projection = &projection{
		mnt: filepath.Join(stateDir, "mnt"), command: opts.ProjectionCommand, store: base, log: f.log, mounter: opts.Mounter,
		logFile: filepath.Join(stateDir, "fuse-server.log"), pidFile: filepath.Join(stateDir, "fuse-server.pid"),
		corruptLog: filepath.Join(stateDir, fusefs.CorruptLogName),
	}
	// What was recorded before this daemon started was reported by the
	// daemon running then (or logged by the server if none was).
	if fi, err := os.Stat(f.projection.corruptLog); err == nil {
		f.corruptOff = fi.Size()
	}

	f.reap = make(chan string, reapQueue)
	f.reaperDone.Add(1)
	go f.reaper()

	scanCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancelScan = cancel
	f.scanDone.Add(1)
	go func() {
		defer f.scanDone.Done()
		f.counting.scan(scanCtx, f.log)
	}()
	if f.cluster != nil {
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f.stopCluster = cancel
		f.clusterDone.Go(func() { f.clusterLoop(cctx) })
	}
	f.log.Info("state opened", "state_dir", stateDir, "version", Version, "worker", f.worker)
	return f, nil
}

func lockStateDir(dir string) (*os.File, error) {
	p := filepath.Join(dir, "lock")
	lf, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock state %s: %w", dir, err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lf.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("state %s is in use by another process: %w", dir, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("lock state %s: %w", dir, err)
	}
	return lf, nil
}

// Close stops background work and releases the state dir. Callers stop
// issuing operations first (the API server shuts down before it).
func (f *Fabric) Close() error {
	f.closeOnce.Do(func() {
		var rerr error
		if f.stopCluster != nil {
			f.stopCluster()
			f.clusterDone.Wait()
			// The worker leaves before its journal closes.
			rerr = f.cluster.Registration.Close()
		}
		f.cancelScan()
		f.scanDone.Wait()
		f.bg.Wait()
		// After bg: a queued start that fails deletes its delta. Later
		// deletions (a caller that did not stop first) happen in place.
		f.reapMu.Lock()
		f.reapClosed = true
		close(f.reap)
		f.reapMu.Unlock()
		f.reaperDone.Wait()
		// The projection server (a child process) and live attempts' mounts
		// stay: a restarted daemon adopts them. An in-process projection
		// (tests) cannot outlive us; StopAll tears everything down.
		if f.tier != nil {
			f.tier.Close() // the upload queue stays for the next start
		}
		var redoErr error
		if f.redo != nil {
			redoErr = f.retireStoreRedo(context.Background())
		}
		jerr := f.journal.Close()
		var serr error
		if f.local != nil {
			serr = f.local.Close() // its redo log's descriptor
		}
		f.closeErr = errors.Join(rerr, redoErr, jerr, serr, f.lock.Close()) // releases the flock
		f.log.Info("state closed", "state_dir", f.stateDir)
	})
	return f.closeErr
}

// StateDir is the absolute state directory.
func (f *Fabric) StateDir() string { return f.stateDir }

// Store is the object store every operation goes through (it keeps the
// object tally of Status current).
func (f *Fabric) Store() cas.Store { return f.store }

// Status describes the daemon and its store.
type Status struct {
	Version  string
	StateDir string
	Objects  int64 // objects in the local store
	Bytes    int64 // their total size
	// Remote describes the remote content store, nil without one.
	Remote *RemoteStatus
}

// RemoteStatus describes the remote content store and the cache.
type RemoteStatus struct {
	Location   string `json:"location"`
	Durability string `json:"durability"` // sync or async
	// Queue: writes and objects waiting for upload (async), and the last
	// upload failure ("" once one succeeded).
	QueueFiles   int    `json:"queue_files"`
	QueueObjects int    `json:"queue_objects"`
	QueueError   string `json:"queue_error,omitempty"`
	// Traffic since the daemon started.
	Fetches       int64 `json:"fetches"`
	FetchedBytes  int64 `json:"fetched_bytes"`
	Uploads       int64 `json:"uploads"`
	UploadedBytes int64 `json:"uploaded_bytes"`
	Corrupt       int64 `json:"corrupt_fetches"`
	Evictions     int64 `json:"evictions"`
	// CacheSize is the bound (0: none), CacheUsed what the tier counts.
	CacheSize int64 `json:"cache_size"`
	CacheUsed int64 `json:"cache_used"`
}

// RemoteStatus reports the remote content store, or nil without one.
func (f *Fabric) RemoteStatus() *RemoteStatus {
	if f.tier == nil {
		return nil
	}
	st := f.tier.Stats()
	q := f.tier.QueueStatus()
	rs := &RemoteStatus{Durability: "sync",
		QueueFiles: q.Files, QueueObjects: q.Objects, QueueError: q.LastError,
		Fetches: st.Fetches.Load(), FetchedBytes: st.FetchedBytes.Load(),
		Uploads: st.Uploads.Load(), UploadedBytes: st.UploadedBytes.Load(),
		Corrupt: st.Corrupt.Load(), Evictions: st.Evictions.Load(),
		CacheSize: f.opts.CacheSize, CacheUsed: f.tier.CacheUsed()}
	if f.opts.RemoteAsync {
		rs.Durability = "async"
	}
	if l, ok := f.opts.Remote.(interface{ Location() string }); ok {
		rs.Location = l.Location()
	}
	return rs
}

// Status reports the version, the state dir and the object tally. Right
// after Open the tally is still being counted: Status waits for it (or for
// ctx).
func (f *Fabric) Status(ctx context.Context) (Status, error) {
	objects, bytes, err := f.counting.tally(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("status: %w", err)
	}
	return Status{Version: Version, StateDir: f.stateDir, Objects: objects, Bytes: bytes, Remote: f.RemoteStatus()}, nil
}

// resolveRoot turns the id a caller names (a root id in hex, or a node id)
// into the root tree it designates, and checks that the tree is stored.
func (f *Fabric) resolveRoot(ctx context.Context, s string) (cas.ID, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return cas.ZeroID, fmt.Errorf("empty id: %w", errdefs.ErrInvalidArgument)
	}
	if strings.HasPrefix(s, string(journal.KindNode)+"_") {
		var n journal.Node
		if err := f.journal.View(ctx, func(r journal.Reader) error {
			var err error
			n, err = journal.GetNode(r, s)
			return err
		}); err != nil {
			return cas.ZeroID, err
		}
		s = n.RootID
	}
	id, err := cas.ParseID(s)
	if err != nil {
		return cas.ZeroID, err
	}
	ok, err := f.store.Has(ctx, id)
	if err != nil {
		return cas.ZeroID, fmt.Errorf("root %s: %w", id, err)
	}
	if !ok {
		return cas.ZeroID, fmt.Errorf("root %s: %w", id, errdefs.ErrNotFound)
	}
	return id, nil
}

// CallInfo is what a request says about itself, carried in its context from
// the API to the operations (idempotency and events use it).
type CallInfo struct {
	// IdempotencyKey is the caller's key for a mutation; empty if none was
	// given.
	IdempotencyKey string
	// KeyGenerated says the key was made up for a caller that sent none
	// (by the API server, or by the Fabric itself): its result is kept
	// Options.GeneratedKeyTTL, not for ever, since only the reply that
	// carried the key can name it.
	KeyGenerated bool
	// TraceID (32 hex digits) and SpanID (16 hex digits) are the W3C trace
	// context of the request: the caller's trace id if it sent a
	// traceparent, a fresh one otherwise, and a span id for this request.
	TraceID string
	SpanID  string
}

type callInfoKey struct{}

// WithCallInfo returns ctx carrying ci.
func WithCallInfo(ctx context.Context, ci CallInfo) context.Context {
	return context.WithValue(ctx, callInfoKey{}, ci)
}

// CallInfoFrom returns the CallInfo of ctx, if any.
func CallInfoFrom(ctx context.Context) (CallInfo, bool) {
	ci, ok := ctx.Value(callInfoKey{}).(CallInfo)
	return ci, ok
}
