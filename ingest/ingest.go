package ingest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/containerd/platforms"
	"github.com/esf-dev/esf/cas"
)

// Store is what an import needs: Put and Has to store content without
// rewriting what is already there, Get for the Builder to read back trees.
type Store interface {
	cas.Putter
	cas.Haser
	cas.Getter
}

// Options tune an import. The zero value is ready to use.
type Options struct {
	Logger *slog.Logger // nil: discard
	// Progress, when set, is called with the number of input bytes consumed
	// so far: file content for Dir, the (compressed) stream for Tar and
	// ApplyTar, archive then layer blob bytes for OCI imports. Calls are
	// never concurrent, values never decrease, and the last call carries
	// the total. It runs on import goroutines and must be cheap.
	Progress func(bytes int64)
	// TempDir holds the scratch content store of OCIArchive; default
	// os.TempDir(). The scratch store is removed before OCIArchive returns.
	TempDir string
	// Platform selects the manifest of a multi-platform OCI image, in
	// containerd's syntax ("linux/arm64/v8"); default the host's.
	Platform string
	// Workers bounds the goroutines that hash and store file content;
	// default 2*GOMAXPROCS.
	Workers int
	// NewContent tells Dir that the content is expected to be new to the
	// store (a first import): large files (over 1 MiB) then go into the
	// store in one pass, hashed as they are written, instead of hashed
	// first and written only when missing, which reads and hashes new
	// content twice. A file found stored is never rewritten either way, but
	// with NewContent finding one costs a temp file written and discarded,
	// so a re-import is no longer write-free; Dir then falls back to hashing
	// first for the files that follow. Upper always starts this way (an
	// upper directory holds what an attempt wrote); Tar streams large
	// members in one pass anyway.
	NewContent bool
	// Exclude lists slash paths below a directory's root ("a/b", or
	// "/a/b") that Dir and Upper skip with everything below them: an
	// executor's mountpoints in an attempt's upper directory are not
	// content.
	Exclude []string
	// Adopt, when set, lets Upper hand every large regular file (over
	// 1 MiB, one name) to the store instead of copying it, where the store
	// can (cas.Adopter; the disk store, on the same file system): the
	// file becomes read-only and shares its inode with the object. Only
	// for an upper directory nobody writes again: the caller must give
	// each such file its own inode back before anyone could (see
	// delta.Unshare). Adopt is called with the file's path below the
	// upper directory, its mode, its owner and its extended attributes
	// (without overlayfs's own) before it is handed over (the store makes
	// the file its own, which clears its file capability); an error fails
	// the seal. Dir ignores it.
	Adopt func(rel string, mode, uid, gid uint32, xattrs []cas.Xattr) error
	// StatCache, when set, lets Dir skip reading files that an earlier
	// import with the same cache read and that did not change since (see
	// StatCache). Upper ignores it.
	StatCache *StatCache
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if o.Workers < 0 {
		return fmt.Errorf("import options: workers %d: %w", o.Workers, cas.ErrInvalidArgument)
	}
	if o.Platform != "" {
		if _, err := platforms.Parse(o.Platform); err != nil {
			return fmt.Errorf("import options: platform %q: %v: %w", o.Platform, err, cas.ErrInvalidArgument)
		}
	}
	return nil
}

func (o Options) withDefaults() (Options, error) {
	if err := o.Validate(); err != nil {
		return o, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.TempDir == "" {
		o.TempDir = os.TempDir()
	}
	if o.Workers == 0 {
		o.Workers = 2 * runtime.GOMAXPROCS(0)
	}
	return o, nil
}

// Stats counts what an import saw. Files, Dirs, Symlinks and Others count
// entries staged, one per name (every name of a hard-linked file counts;
// for OCI images every layer's entries count, including those a later
// layer replaces). Bytes counts file content read, each inode once.
type Stats struct {
	Files    int64 `json:"files"`
	Dirs     int64 `json:"dirs"`
	Symlinks int64 `json:"symlinks"`
	Others   int64 `json:"others"` // devices and fifos
	Bytes    int64 `json:"bytes"`
	// NewObjects and NewBytes count objects (blobs and trees) this import
	// created in the store; re-importing the same content creates none.
	NewObjects int64 `json:"new_objects"`
	NewBytes   int64 `json:"new_bytes"`
	// Skipped lists paths that cannot be represented (sockets, unknown tar
	// entry types); each was logged as a warning.
	Skipped []string `json:"skipped,omitempty"`
}

func (s *Stats) add(o Stats) {
	s.Files += o.Files
	s.Dirs += o.Dirs
	s.Symlinks += o.Symlinks
	s.Others += o.Others
	s.Bytes += o.Bytes
	s.NewObjects += o.NewObjects
	s.NewBytes += o.NewBytes
	s.Skipped = append(s.Skipped, o.Skipped...)
}

func (s *Stats) count(t cas.Type) {
	switch t {
	case cas.TypeFile:
		s.Files++
	case cas.TypeDir:
		s.Dirs++
	case cas.TypeSymlink:
		s.Symlinks++
	default:
		s.Others++
	}
}

// Result is what an import produced: the root tree and its Stats.
type Result struct {
	Root cas.ID `json:"root_id"`
	Stats
}

// smallFileMax is the largest content read whole into memory: it is hashed
// and looked up before anything is written. Larger content is streamed.
const smallFileMax = 1 << 20

// progress serialises calls of Options.Progress: workers add bytes
// concurrently, and whoever finds the callback free reports the total.
type progress struct {
	fn   func(int64)
	n    atomic.Int64
	mu   sync.Mutex
	last int64
}

func newProgress(fn func(int64)) *progress { return &progress{fn: fn} }

func (p *progress) add(n int64) {
	if p == nil || p.fn == nil || n == 0 {
		return
	}
	p.n.Add(n)
	// A busy reporter will be followed by another report soon enough;
	// waiting for it would serialise the workers.
	if p.mu.TryLock() {
		p.report()
		p.mu.Unlock()
	}
}

// done makes sure the last call carries the total.
func (p *progress) done() {
	if p == nil || p.fn == nil {
		return
	}
	p.mu.Lock()
	p.report()
	p.mu.Unlock()
}

func (p *progress) report() {
	if v := p.n.Load(); v > p.last {
		p.last = v
		p.fn(v)
	}
}

// ctxReader fails reads once ctx is done, so long copies stop promptly.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, context.Cause(c.ctx)
	}
	return c.r.Read(p)
}

// source wraps the raw input of an import. It counts progress, honours
// cancellation and remembers a failure of the input itself, which tells an
// I/O error (returned as is) from malformed content (ErrInvalidArgument)
// once the error has come through decompressors and the tar reader. A zstd
// decoder reads it from its own goroutine, hence the atomics.
type source struct {
	ctx  context.Context
	r    io.Reader
	prog *progress
	n    atomic.Int64
	mu   sync.Mutex
	err  error
}

func (s *source) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, context.Cause(s.ctx)
	}
	n, err := s.r.Read(p)
	s.n.Add(int64(n))
	s.prog.add(int64(n))
	if err != nil && err != io.EOF {
		s.mu.Lock()
		if s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
	}
	return n, err
}

// inputErr returns the input's own failure, if any.
func (s *source) inputErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// classify turns an error met while parsing the input into the error to
// return: cancellation and input failures as they are, anything else as
// malformed input.
func (s *source) classify(what string, err error) error {
	if s.ctx.Err() != nil {
		return context.Cause(s.ctx)
	}
	if ierr := s.inputErr(); ierr != nil {
		return fmt.Errorf("%s: %w", what, ierr)
	}
	return fmt.Errorf("%s: %v: %w", what, err, cas.ErrInvalidArgument)
}

// timeNs converts seconds and nanoseconds to the tree's mtime, saturating
// where int64 nanoseconds end (years before 1678 or after 2262).
func timeNs(sec, nsec int64) int64 {
	const lim = math.MaxInt64/1_000_000_000 - 1
	switch {
	case sec > lim:
		return math.MaxInt64
	case sec < -lim:
		return math.MinInt64
	}
	return sec*1e9 + nsec
}

func logDone(l *slog.Logger, kind, from string, root cas.ID, s *Stats) {
	l.Debug("import: done", "kind", kind, "from", from, "root_id", root,
		"files", s.Files, "dirs", s.Dirs, "symlinks", s.Symlinks, "others", s.Others,
		"bytes", s.Bytes, "new_objects", s.NewObjects, "new_bytes", s.NewBytes, "skipped", len(s.Skipped))
}
