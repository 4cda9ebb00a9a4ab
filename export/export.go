package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/esf-dev/esf/cas"
)

// Options tune an export. The zero value is ready to use.
type Options struct {
	// Logger receives debug detail and warnings about what was skipped;
	// nil discards.
	Logger *slog.Logger
	// Progress, if set, is called on the exporting goroutine with the number
	// of content bytes just written (a delta, not a running total).
	Progress func(bytes int64)
	// NoOwnership skips chown in ToDir. Without it ToDir sets owners when it
	// runs as root and leaves them to the kernel otherwise. Tars always carry
	// the tree's numeric ids.
	NoOwnership bool
	// NoXattrs leaves extended attributes out of the export.
	NoXattrs bool
	// PreservePrivileged keeps what could give privilege to whoever runs
	// or opens the exported files on the host: setuid and setgid bits of
	// non-directories, security.* xattrs (file capabilities among them)
	// and character and block devices. Without it they are dropped and
	// counted in Stats.Dropped: a sandbox's output must not become a
	// setuid-root binary or a world-writable disk on the host.
	PreservePrivileged bool
	// VerifiedFile, if set, returns an open file holding blob id raw that
	// the store has verified (hashed to id) and that has not changed since,
	// or nil; ToDir closes it. ToDir copies such a blob in the kernel
	// (copy_file_range: extents shared where the file system can, an
	// in-kernel copy elsewhere) instead of streaming and hashing it again;
	// other blobs, and files with holes, stream through the Getter. ToTar
	// does not use it. cas/local.Store.OpenVerified fits.
	VerifiedFile func(id cas.ID) *os.File
	// ReadSmall, if set, reads blob id of size bytes whole into buf (longer
	// than size) and returns buf[:size] once those bytes hash to id: an
	// error wrapping cas.ErrCorrupt when they do not or the blob has another
	// size, cas.ErrNotFound when the store has no such blob (the export then
	// asks the Getter). ToDir and ToTar read blobs smaller than their copy
	// buffer (1 MiB) through it instead of a Getter's verifying reader, which
	// costs a reader, a hasher and more syscalls per file.
	// cas/local.Store.ReadSmall fits.
	ReadSmall func(id cas.ID, size int64, buf []byte) ([]byte, error)
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Progress == nil {
		o.Progress = func(int64) {}
	}
	return o
}

// Stats counts what an export produced.
type Stats struct {
	Files    int64 // regular files written with content
	Dirs     int64 // directories, the root included
	Symlinks int64
	Others   int64 // fifos and devices
	Links    int64 // extra names of hard-link groups (linked, not written)
	Bytes    int64 // content bytes written
	// Skipped counts what ToDir could not materialise and only warned about:
	// devices mknod refused, xattrs the filesystem or privileges refused.
	Skipped int64
	// Dropped is what the export left out on purpose because it could give
	// privilege on the host (see Options.PreservePrivileged).
	Dropped Dropped
}

// Dropped says what an export left out because it could give privilege on
// the host. A dropped device is not written at all; a file that lost its
// setuid or setgid bit or a security.* xattr is written without them.
type Dropped struct {
	SetID   int64 `json:"setid"`   // non-directories whose setuid/setgid bits were cleared
	Xattrs  int64 `json:"xattrs"`  // security.* xattrs left out
	Devices int64 `json:"devices"` // character and block devices left out
	// Paths are the first MaxDroppedPaths paths (relative to the root)
	// that lost something, in export order, never null.
	Paths []string `json:"paths"`
}

// MaxDroppedPaths bounds Dropped.Paths, so a tree full of devices costs a
// bounded report.
const MaxDroppedPaths = 100

// Any reports whether anything was dropped.
func (d Dropped) Any() bool { return d.SetID+d.Xattrs+d.Devices > 0 }

// String says what was dropped in a few words, "" when nothing was.
func (d Dropped) String() string {
	var parts []string
	if d.SetID > 0 {
		parts = append(parts, fmt.Sprintf("%d setuid/setgid bits", d.SetID))
	}
	if d.Xattrs > 0 {
		parts = append(parts, fmt.Sprintf("%d security.* xattrs", d.Xattrs))
	}
	if d.Devices > 0 {
		parts = append(parts, fmt.Sprintf("%d device nodes", d.Devices))
	}
	return strings.Join(parts, ", ")
}

// privFilter applies the privileged-content policy of one export and keeps
// its Dropped count. Each method takes an entry's path (for the report) and
// returns what may be written.
type privFilter struct {
	preserve bool
	d        *Dropped
	last     string // last path added to d.Paths, so a path is listed once
}

func (p *privFilter) note(rel string) {
	if rel == "" {
		rel = "."
	}
	if p.last == rel || len(p.d.Paths) >= MaxDroppedPaths {
		return
	}
	p.last = rel
	p.d.Paths = append(p.d.Paths, rel)
}

// setIDBits are setuid and setgid. On a directory setgid only passes the
// group on to new entries, which gives nothing, so directories keep it.
const setIDBits = 0o6000

// mode returns the mode to write for a node of type typ.
func (p *privFilter) mode(typ cas.Type, mode uint32, rel string) uint32 {
	if p.preserve || typ == cas.TypeDir || mode&setIDBits == 0 {
		return mode
	}
	p.d.SetID++
	p.note(rel)
	return mode &^ setIDBits
}

// xattrs returns xs without security.* names; xs itself is not modified.
func (p *privFilter) xattrs(xs []cas.Xattr, rel string) []cas.Xattr {
	if p.preserve {
		return xs
	}
	var out []cas.Xattr
	for i, xa := range xs {
		if !strings.HasPrefix(xa.Name, "security.") {
			if out != nil {
				out = append(out, xa)
			}
			continue
		}
		if out == nil {
			out = append(make([]cas.Xattr, 0, len(xs)), xs[:i]...)
		}
		p.d.Xattrs++
		p.note(rel)
	}
	if out == nil {
		return xs
	}
	return out
}

// device reports whether a node of type typ is left out.
func (p *privFilter) device(typ cas.Type, rel string) bool {
	if p.preserve || (typ != cas.TypeCharDev && typ != cas.TypeBlockDev) {
		return false
	}
	p.d.Devices++
	p.note(rel)
	return true
}

// bufSize is the copy buffer: large enough to keep syscalls few, small
// enough that an export's memory does not depend on its files' sizes.
const bufSize = 1 << 20

var emptyID = cas.Sum(nil)

// copyBlob streams the content of file entry e to w through buf and returns
// the bytes written. A blob that is not the content of e (hash or size) is
// ErrCorrupt; by then part of it may have been written, so callers write
// somewhere they can discard.
func copyBlob(ctx context.Context, g cas.Getter, e *cas.Entry, w io.Writer, buf []byte, opts *Options) (int64, error) {
	if e.Size == 0 && e.ID == emptyID {
		return 0, nil
	}
	if opts.ReadSmall != nil && e.Size < int64(len(buf)) {
		b, err := opts.ReadSmall(e.ID, e.Size, buf)
		if err == nil {
			if _, err := w.Write(b); err != nil {
				return 0, err
			}
			opts.Progress(e.Size)
			return e.Size, nil
		}
		if !errors.Is(err, cas.ErrNotFound) {
			return 0, fmt.Errorf("blob %s: %w", e.ID.Short(), err)
		}
		// Not in this store (a cache in front of another one): the Getter
		// knows where it is.
	}
	progress := opts.Progress
	rc, err := g.Get(ctx, e.ID)
	if err != nil {
		return 0, fmt.Errorf("blob %s: %w", e.ID.Short(), err)
	}
	defer rc.Close()
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		m, rerr := rc.Read(buf)
		if m > 0 {
			if n+int64(m) > e.Size {
				return n, fmt.Errorf("blob %s: longer than the entry's %d bytes: %w", e.ID.Short(), e.Size, ErrCorrupt)
			}
			if _, err := w.Write(buf[:m]); err != nil {
				return n, err
			}
			n += int64(m)
			progress(int64(m))
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return n, fmt.Errorf("blob %s: %w", e.ID.Short(), rerr)
		}
	}
	if n != e.Size {
		return n, fmt.Errorf("blob %s: %d bytes, the entry says %d: %w", e.ID.Short(), n, e.Size, ErrCorrupt)
	}
	return n, nil
}

// sameContent reports whether two members of one link group can be one
// inode. Their attributes should agree too, but the first member's win; a
// different type or content means the tree lies about the group.
func sameContent(a, b *cas.Entry) bool {
	return a.Type == b.Type && a.ID == b.ID && a.Size == b.Size && a.Target == b.Target &&
		a.Major == b.Major && a.Minor == b.Minor
}

// checkEntry repeats the decoder's checks that safety depends on, so that a
// tree from a source that skipped validation still cannot steer the export.
func checkEntry(e *cas.Entry) error {
	if err := cas.ValidName(e.Name); err != nil {
		return fmt.Errorf("%v: %w", err, ErrCorrupt)
	}
	switch e.Type {
	case cas.TypeFile, cas.TypeDir, cas.TypeSymlink, cas.TypeCharDev, cas.TypeBlockDev, cas.TypeFIFO:
	default:
		return fmt.Errorf("entry %q: unknown type %d: %w", e.Name, e.Type, ErrCorrupt)
	}
	if e.Type == cas.TypeSymlink && (e.Target == "" || strings.IndexByte(e.Target, 0) >= 0) {
		return fmt.Errorf("entry %q: bad symlink target: %w", e.Name, ErrCorrupt)
	}
	if e.Mode&^cas.ModeMask != 0 {
		return fmt.Errorf("entry %q: mode %o: %w", e.Name, e.Mode, ErrCorrupt)
	}
	return nil
}

func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// Lookup resolves a slash-separated path inside root and returns its entry as
// stored in its parent tree (a directory entry carries only Name, Type and
// its tree's ID). The empty path, "/" and "." name the root itself, returned
// as a directory entry with an empty name. Leading "/" and "./" and a
// trailing "/" are accepted; "." or ".." components, empty components and
// invalid names are ErrInvalidArgument. A missing path, or one that goes
// through a non-directory (symlinks are not followed), is ErrNotFound.
func Lookup(ctx context.Context, g cas.Getter, root cas.ID, path string) (cas.Entry, error) {
	p := path
	for {
		q := strings.TrimPrefix(strings.TrimLeft(p, "/"), "./")
		if q == p {
			break
		}
		p = q
	}
	p = strings.TrimRight(p, "/")
	if p == "" || p == "." {
		return cas.Entry{Type: cas.TypeDir, ID: root}, nil
	}
	if err := cas.ValidPath(p); err != nil {
		return cas.Entry{}, fmt.Errorf("lookup %q: %w", path, err)
	}
	parts := strings.Split(p, "/")
	cur := cas.Entry{Type: cas.TypeDir, ID: root}
	for i, name := range parts {
		if err := ctx.Err(); err != nil {
			return cas.Entry{}, err
		}
		if cur.Type != cas.TypeDir {
			return cas.Entry{}, fmt.Errorf("lookup %q: %s is a %s, not a directory: %w",
				path, strings.Join(parts[:i], "/"), cur.Type, ErrNotFound)
		}
		t, err := cas.ReadTreeView(ctx, g, cur.ID)
		if err != nil {
			return cas.Entry{}, fmt.Errorf("lookup %q: %w", path, err)
		}
		e, ok := t.Lookup(name)
		if !ok {
			return cas.Entry{}, fmt.Errorf("lookup %q: %s: %w", path, strings.Join(parts[:i+1], "/"), ErrNotFound)
		}
		cur = e
	}
	return cur, nil
}
