package export

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/internal/atomicfile"
)

// ToTar streams root to w as a PAX tar: the root directory first as "./",
// then every entry in depth-first name order as "./path" ("./path/" for a
// directory), with numeric owners and empty user and group names, mtimes to
// the nanosecond, xattrs as SCHILY.xattr.* records (unless NoXattrs), device
// numbers, fifos, and every hard-link member after the first as a TypeLink to
// the first member's name. No atime, ctime or host-dependent field is
// written, so the same root always gives the same bytes. Content is verified
// as it streams: when a blob turns out corrupt, most of its bytes are already
// in w. So on any error w holds a truncated archive without its
// end-of-archive marker (strict readers such as GNU tar report it; Go's
// archive/tar may not), and the caller must discard it, as WriteTarFile does.
// ToTar does not close w.
func ToTar(ctx context.Context, g cas.Getter, root cas.ID, w io.Writer, opts Options) (Stats, error) {
	return toTar(ctx, g, root, w, opts, readView)
}

func toTar(ctx context.Context, g cas.Getter, root cas.ID, w io.Writer, opts Options, read treeReader) (Stats, error) {
	opts = opts.withDefaults()
	// archive/tar writes each header block, PAX record and padding on its
	// own: unbuffered, a small file cost w four or five writes (syscalls, or
	// HTTP chunks through the API). What is buffered reaches w on failure
	// too, so w holds the same bytes as unbuffered.
	bw := bufio.NewWriterSize(w, tarBufSize)
	x := &tarExporter{
		ctx:      ctx,
		g:        g,
		opts:     opts,
		readTree: read,
		bw:       bw,
		tw:       tar.NewWriter(bw),
		buf:      make([]byte, bufSize),
		links:    map[string]tarFirst{},
	}
	x.priv = privFilter{preserve: opts.PreservePrivileged, d: &x.stats.Dropped}
	err := x.run(root)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return x.stats, fmt.Errorf("export %s as tar: %w", root.Short(), err)
	}
	return x.stats, nil
}

// tarBufSize is how much ToTar gathers before writing to its writer.
const tarBufSize = 256 << 10

type tarExporter struct {
	ctx      context.Context
	g        cas.Getter
	opts     Options
	readTree treeReader
	bw       *bufio.Writer
	tw       *tar.Writer
	hdr      []byte // appendHeader's output, reused
	buf      []byte
	stats    Stats
	links    map[string]tarFirst
	priv     privFilter
}

type tarFirst struct {
	name  string // as written in the archive
	entry cas.Entry
}

func (x *tarExporter) run(root cas.ID) error {
	t, err := x.readTree(x.ctx, x.g, root)
	if err != nil {
		return err
	}
	if err := x.write(x.header(tar.TypeDir, "./", "", &t.Attr, true)); err != nil {
		return err
	}
	x.stats.Dirs++
	if err := x.walk(t, ""); err != nil {
		return err
	}
	// Only a complete archive gets its end marker.
	return x.tw.Close()
}

func (x *tarExporter) walk(t *dirTree, dir string) error {
	return t.each(func(e *cas.Entry) error {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		if err := checkEntry(e); err != nil {
			if dir == "" {
				return err
			}
			return fmt.Errorf("%s: %w", dir, err)
		}
		rel := joinPath(dir, e.Name)
		if e.Type == cas.TypeDir {
			ct, err := x.readTree(x.ctx, x.g, e.ID)
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			if err := x.write(x.header(tar.TypeDir, "./"+rel+"/", rel, &ct.Attr, true)); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			x.stats.Dirs++
			return x.walk(ct, rel)
		}
		if err := x.leaf(e, rel); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return nil
	})
}

func (x *tarExporter) leaf(e *cas.Entry, rel string) error {
	name := "./" + rel
	if x.priv.device(e.Type, rel) {
		// Every member of a device's link group is dropped alike.
		return nil
	}
	if e.LinkGroup != "" {
		if first, ok := x.links[e.LinkGroup]; ok {
			if !sameContent(&first.entry, e) {
				return fmt.Errorf("link group %q: members differ in type or content: %w", e.LinkGroup, ErrCorrupt)
			}
			// Extractors apply nothing but the link from this header, so it
			// carries no xattrs.
			h := x.header(tar.TypeLink, name, rel, &e.Attr, false)
			h.Linkname = first.name
			if err := x.write(h); err != nil {
				return err
			}
			x.stats.Links++
			return nil
		}
		x.links[e.LinkGroup] = tarFirst{name: name, entry: *e}
	}
	switch e.Type {
	case cas.TypeFile:
		h := x.header(tar.TypeReg, name, rel, &e.Attr, true)
		h.Size = e.Size
		raw, err := x.writeHeader(h)
		if err != nil {
			return err
		}
		var w io.Writer = x.tw
		if raw {
			// The tar.Writer did not see this header: the member's data
			// and padding go around it too.
			w = x.bw
		}
		n, err := copyBlob(x.ctx, x.g, e, w, x.buf, &x.opts)
		if err != nil {
			return err
		}
		if raw {
			if _, err := x.bw.Write(zeroBlock[:padding(n)]); err != nil {
				return err
			}
		}
		x.stats.Files++
		x.stats.Bytes += n
		return nil
	case cas.TypeSymlink:
		h := x.header(tar.TypeSymlink, name, rel, &e.Attr, true)
		h.Linkname = e.Target
		x.stats.Symlinks++
		return x.write(h)
	case cas.TypeCharDev, cas.TypeBlockDev:
		typ := byte(tar.TypeChar)
		if e.Type == cas.TypeBlockDev {
			typ = tar.TypeBlock
		}
		h := x.header(typ, name, rel, &e.Attr, true)
		h.Devmajor, h.Devminor = int64(e.Major), int64(e.Minor)
		x.stats.Others++
		return x.write(h)
	case cas.TypeFIFO:
		x.stats.Others++
		return x.write(x.header(tar.TypeFifo, name, rel, &e.Attr, true))
	}
	return fmt.Errorf("unknown type %d: %w", e.Type, ErrCorrupt)
}

const paxXattr = "SCHILY.xattr."

// header builds the header of the node at rel (relative to the root, for the
// report of what was dropped) named name in the archive. A TypeLink header
// carries the first member's mode as it was written.
func (x *tarExporter) header(typ byte, name, rel string, a *cas.Attr, xattrs bool) *tar.Header {
	mode := a.Mode
	switch typ {
	case tar.TypeDir:
	case tar.TypeLink:
		// Extractors apply nothing but the link, and the first member was
		// counted already; the bits go all the same.
		if !x.priv.preserve {
			mode &^= setIDBits
		}
	default:
		mode = x.priv.mode(cas.TypeFile, mode, rel)
	}
	h := &tar.Header{
		Typeflag: typ,
		Name:     name,
		Mode:     int64(mode),
		Uid:      int(a.UID),
		Gid:      int(a.GID),
		ModTime:  time.Unix(0, a.MtimeNs),
		// PAX keeps nanoseconds; archive/tar adds records only where a
		// field needs them, and sorts them, so output stays deterministic.
		Format: tar.FormatPAX,
	}
	var xs []cas.Xattr
	if xattrs && !x.opts.NoXattrs {
		xs = x.priv.xattrs(a.Xattrs, rel)
	}
	if len(xs) > 0 {
		h.PAXRecords = make(map[string]string, len(xs))
		for _, xa := range xs {
			h.PAXRecords[paxXattr+xa.Name] = string(xa.Value)
		}
	}
	return h
}

func (x *tarExporter) write(h *tar.Header) error {
	_, err := x.writeHeader(h)
	return err
}

// writeHeader writes h, itself when it can (appendHeader; then raw is true
// and the caller writes the member's data and padding to x.bw), else
// through the tar.Writer.
func (x *tarExporter) writeHeader(h *tar.Header) (raw bool, err error) {
	if fastHeader(h) {
		// What the tar.Writer holds back (the last member's padding) goes
		// first.
		if err := x.tw.Flush(); err != nil {
			return false, fmt.Errorf("tar header: %w", err)
		}
		x.hdr = appendHeader(x.hdr[:0], h)
		_, err := x.bw.Write(x.hdr)
		return true, err
	}
	for k := range h.PAXRecords {
		// A PAX key cannot hold '='; Linux allows it in xattr names.
		if strings.IndexByte(k, '=') >= 0 {
			return false, fmt.Errorf("xattr %q cannot be written to a tar: %w", strings.TrimPrefix(k, paxXattr), ErrUnsupported)
		}
	}
	if err := x.tw.WriteHeader(h); err != nil {
		return false, fmt.Errorf("tar header: %w", err)
	}
	return false, nil
}

// WriteTarFile writes root as a tar to path, compressed by its suffix:
// ".tar.zst" or ".tzst" with zstd, ".tar.gz" or ".tgz" with gzip, anything
// else plain. It replaces path atomically (internal/atomicfile): path holds
// either its old content or the whole new archive. The file is mode 0644.
// On error the temporary file is removed.
func WriteTarFile(ctx context.Context, g cas.Getter, root cas.ID, path string, opts Options) (st Stats, err error) {
	base := filepath.Base(path)
	f, err := atomicfile.Create(path, 0o644)
	if err != nil {
		return st, fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		f.Abort()
		if err != nil {
			err = fmt.Errorf("write %s: %w", path, err)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	var w io.Writer = bw
	var comp io.WriteCloser
	switch lower := strings.ToLower(base); {
	case strings.HasSuffix(lower, ".tar.zst"), strings.HasSuffix(lower, ".tzst"):
		enc, err := zstd.NewWriter(bw)
		if err != nil {
			return st, err
		}
		comp = enc
	case strings.HasSuffix(lower, ".tar.gz"), strings.HasSuffix(lower, ".tgz"):
		comp = gzip.NewWriter(bw)
	}
	if comp != nil {
		w = comp
	}
	st, err = ToTar(ctx, g, root, w, opts)
	if comp != nil {
		// Close even after a failure: the zstd encoder owns goroutines.
		if cerr := comp.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return st, err
	}
	if err := bw.Flush(); err != nil {
		return st, err
	}
	return st, f.Commit()
}
