package fusefs

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/esf-dev/esf/cas"
)

// PathStore is a Getter that can also name the local file holding a blob,
// which lets the kernel read it directly (passthrough).
type PathStore interface {
	cas.Getter
	Path(id cas.ID) string
}

// Options configure a projection.
type Options struct {
	// Store is read for trees and blobs. Required.
	Store cas.Getter
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
	// Timeout is the kernel's entry, attribute and negative-entry cache
	// lifetime. Content never changes, so the default is a day.
	Timeout time.Duration
	// NoPassthrough serves reads through this process even when the store
	// could hand out backing files (for measurements and old kernels).
	NoPassthrough bool
	// Debug logs every FUSE request.
	Debug bool
	// OnCorrupt, if set, is called (on a request's goroutine) with every
	// blob whose content was found not to match its id; the open that
	// found it fails with EIO.
	OnCorrupt func(id cas.ID)
}

func (o *Options) validate() error {
	if o.Store == nil {
		return fmt.Errorf("fusefs: Options.Store is required: %w", cas.ErrInvalidArgument)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Timeout <= 0 {
		o.Timeout = 24 * time.Hour
	}
	return nil
}

// Counters are operation counts, for metrics and for tests that prove
// laziness.
type Counters struct {
	Lookups, Readdirs, Opens, TreeReads, BlobVerifies atomic.Int64
	// CorruptBlobs counts opens refused because a blob did not match its
	// id.
	CorruptBlobs atomic.Int64
	// Reads counts reads served by this process: zero for files the kernel
	// reads through passthrough.
	Reads atomic.Int64
	// Opendirs counts OPENDIR requests. A kernel that can open directories
	// without the server (handlelessDirs) sends one per mount.
	Opendirs atomic.Int64
}

// FS is the projection: the root of the mount.
type FS struct {
	fs.Inode
	opts     Options
	paths    PathStore // nil when the store cannot name files
	Counters Counters

	// handleless is set once the kernel opens directories without the
	// server (handlelessDirs).
	handleless atomic.Bool

	mu           sync.Mutex
	verified     map[cas.ID]fileKey // the blob file as last hashed good
	holesChecked map[string]bool    // see checkHoles
}

// New returns the root node of a projection over opts.Store.
func New(opts Options) (*FS, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	f := &FS{opts: opts, verified: map[cas.ID]fileKey{}, holesChecked: map[string]bool{}}
	if ps, ok := opts.Store.(PathStore); ok && !opts.NoPassthrough {
		f.paths = ps
	}
	return f, nil
}

var (
	_ fs.NodeLookuper  = (*FS)(nil)
	_ fs.NodeGetattrer = (*FS)(nil)
)

// Getattr of the mount root.
func (f *FS) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o555
	out.Nlink = 3
	return 0
}

// StatsName is a read-only file at the mount root whose content is the
// server's Counters as JSON, read fresh on every open: the daemon scrapes
// it for metrics, since the server runs in its own process.
const StatsName = ".stats"

// Lookup of the mount root: "roots" and the stats file.
func (f *FS) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if name == StatsName {
		out.Mode = syscall.S_IFREG | 0o444
		out.SetEntryTimeout(0)
		out.SetAttrTimeout(0)
		return f.NewPersistentInode(ctx, &statsFile{fsys: f}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: 3}), 0
	}
	if name != "roots" {
		return nil, syscall.ENOENT
	}
	out.Mode = syscall.S_IFDIR | 0o555
	out.Nlink = 2
	return f.NewPersistentInode(ctx, &rootsDir{fsys: f}, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: 2}), 0
}

// Readdir of the mount root.
func (f *FS) Readdir(context.Context) (fs.DirStream, syscall.Errno) {
	return fs.NewListDirStream([]fuse.DirEntry{{Name: "roots", Mode: syscall.S_IFDIR, Ino: 2}}), 0
}

// rootsDir resolves root ids; it lists nothing.
type rootsDir struct {
	fs.Inode
	fsys *FS
}

var _ fs.NodeLookuper = (*rootsDir)(nil)

func (r *rootsDir) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o111 // traversable, not listable
	out.Nlink = 2
	return 0
}

func (r *rootsDir) Readdir(context.Context) (fs.DirStream, syscall.Errno) {
	return fs.NewListDirStream(nil), 0
}

func (r *rootsDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	id, err := cas.ParseID(name)
	if err != nil {
		return nil, syscall.ENOENT
	}
	d := &dirNode{fsys: r.fsys, root: id, id: id}
	if errno := d.ensure(ctx); errno != 0 {
		// A root the store lacks now may be stored later: a seal commits
		// its node before it links its small batch into the store (the
		// one-flush seal), and a collected root comes back when a seal
		// makes the same tree. So no negative entry for it: with a
		// nonzero entry timeout go-fuse passes ENOENT on as an error,
		// which the kernel does not cache, instead of turning it into a
		// negative entry of NegativeTimeout (a day).
		out.SetEntryTimeout(time.Nanosecond)
		return nil, errno
	}
	d.fillAttr(&out.Attr)
	r.fsys.setTimeouts(out)
	return r.NewInode(ctx, d, fs.StableAttr{Mode: syscall.S_IFDIR, Ino: inoFor(id, "", false)}), 0
}

func (f *FS) setTimeouts(out *fuse.EntryOut) {
	out.SetEntryTimeout(f.opts.Timeout)
	out.SetAttrTimeout(f.opts.Timeout)
}

// inoFor derives a stable inode number from the root and a path in it (or
// a link group's name). Numbers 1 and 2 belong to the mount root and roots/.
func inoFor(root cas.ID, path string, link bool) uint64 {
	h := cas.NewHasher()
	h.Write(root[:])
	if link {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
	h.Write([]byte(path))
	var sum [cas.IDSize]byte
	h.Sum(sum[:0])
	ino := binary.LittleEndian.Uint64(sum[:8]) &^ (1 << 63) // below go-fuse's automatic numbers
	if ino < 16 {
		ino += 16
	}
	return ino
}

// Snapshot is a copy of the counters, as the stats file shows them.
type Snapshot struct {
	Lookups      int64 `json:"lookups"`
	Readdirs     int64 `json:"readdirs"`
	Opens        int64 `json:"opens"`
	TreeReads    int64 `json:"tree_reads"`
	BlobVerifies int64 `json:"blob_verifies"`
	Reads        int64 `json:"reads"`
	CorruptBlobs int64 `json:"corrupt_blobs"`
}

// Snapshot reads the counters.
func (c *Counters) Snapshot() Snapshot {
	return Snapshot{Lookups: c.Lookups.Load(), Readdirs: c.Readdirs.Load(), Opens: c.Opens.Load(),
		TreeReads: c.TreeReads.Load(), BlobVerifies: c.BlobVerifies.Load(), Reads: c.Reads.Load(),
		CorruptBlobs: c.CorruptBlobs.Load()}
}

// statsFile serves Snapshot as JSON; direct I/O so every read is fresh.
type statsFile struct {
	fs.Inode
	fsys *FS
}

var (
	_ fs.NodeOpener    = (*statsFile)(nil)
	_ fs.NodeGetattrer = (*statsFile)(nil)
)

func (s *statsFile) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	out.Size = 0 // unknown until read: direct I/O reads to EOF
	return 0
}

func (s *statsFile) Open(_ context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	b, err := json.Marshal(s.fsys.Counters.Snapshot())
	if err != nil {
		return nil, 0, syscall.EIO
	}
	return &bytesHandle{b: append(b, '\n')}, fuse.FOPEN_DIRECT_IO, 0
}

type bytesHandle struct{ b []byte }

var _ fs.FileReader = (*bytesHandle)(nil)

func (h *bytesHandle) Read(_ context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= int64(len(h.b)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(h.b[off:min(int64(len(h.b)), off+int64(len(dest)))]), 0
}
