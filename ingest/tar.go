package ingest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/esf-dev/esf/cas"
)

// Tar imports a tar stream into st and returns its root. The stream may be
// plain, gzip or zstd, told apart by magic bytes. A "./" (or "/") entry
// sets the root's attributes; names are cleaned, and one that escapes the
// root ("../x", "/a/../../x") is ErrInvalidArgument, as is malformed input.
// Content is streamed into the store; members up to 1 MiB are buffered.
func Tar(ctx context.Context, st Store, r io.Reader, opts Options) (Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Result{}, err
	}
	src := &source{ctx: ctx, r: r, prog: newProgress(opts.Progress)}
	tr, closeFn, err := decompress(src)
	if err != nil {
		return Result{}, err
	}
	defer closeFn()
	obj := newObjects(st)
	defer obj.abort()
	b := cas.NewBuilder(st, cas.ZeroID)
	s, err := applyTar(ctx, obj, b, tr, false, opts, src)
	if err != nil {
		return Result{}, err
	}
	// Read to the end so a compressed stream's checksum is verified even
	// though tar stops at its end-of-archive blocks.
	if _, err := io.Copy(io.Discard, tr); err != nil {
		return Result{}, src.classify("tar", err)
	}
	src.prog.done()
	id, err := obj.finish(ctx, b, &s)
	if err != nil {
		return Result{}, fmt.Errorf("import tar: %w", err)
	}
	logDone(opts.Logger, "tar", "", id, &s)
	return Result{Root: id, Stats: s}, nil
}

// ApplyTar applies the uncompressed tar stream r to b, storing content in
// st; it writes no trees (b.Write does). Entries replace what b holds at
// their path, as extracting over a directory would; a directory entry over
// an existing directory only sets its attributes.
//
// With layer set, r is an OCI image layer: ".wh.NAME" deletes NAME and
// ".wh..wh..opq" empties its directory. Whiteouts hide only what lower
// layers (b's content before the call) put there, never what this layer
// adds, whatever order the entries come in. Other ".wh..wh." names (aufs
// metadata) are ignored.
func ApplyTar(ctx context.Context, st Store, b *cas.Builder, r io.Reader, layer bool, opts Options) (Stats, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Stats{}, err
	}
	src := &source{ctx: ctx, r: r, prog: newProgress(opts.Progress)}
	obj := newObjects(st)
	defer obj.abort()
	s, err := applyTar(ctx, obj, b, src, layer, opts, src)
	if err != nil {
		return Stats{}, err
	}
	src.prog.done()
	// The caller's b.Write will name these objects: publish them now.
	if err := obj.commit(ctx, &s); err != nil {
		return Stats{}, err
	}
	return s, nil
}

// Magic bytes of the compressions Tar reads, and of some it does not.
var (
	magicGzip  = []byte{0x1f, 0x8b}
	magicZstd  = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicXz    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	magicBzip2 = []byte("BZh")
	bzip2Block = []byte{0x31, 0x41, 0x59, 0x26, 0x53, 0x59}
)

// zstdMaxWindow is the largest window a zstd stream may ask for: the
// zstd tool's own default limit, which keeps hostile input from claiming
// gigabytes.
const zstdMaxWindow = 128 << 20

// decompress sniffs r and returns the tar stream inside it. The returned
// close function releases the decoder (zstd runs goroutines).
func decompress(src *source) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(src, 64<<10)
	magic, err := br.Peek(10)
	if err != nil && err != io.EOF {
		return nil, nil, src.classify("tar", err)
	}
	switch {
	case bytes.HasPrefix(magic, magicGzip):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, src.classify("gzip", err)
		}
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, magicZstd):
		zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return nil, nil, src.classify("zstd", err)
		}
		return zr, zr.Close, nil
	case bytes.HasPrefix(magic, magicXz):
		return nil, nil, fmt.Errorf("tar: xz compression: %w", cas.ErrUnsupported)
	case len(magic) == 10 && bytes.HasPrefix(magic, magicBzip2) && magic[3] >= '1' && magic[3] <= '9' &&
		bytes.Equal(magic[4:], bzip2Block):
		return nil, nil, fmt.Errorf("tar: bzip2 compression: %w", cas.ErrUnsupported)
	}
	return br, func() {}, nil
}

// applyTar stages the tar stream r into b, storing content through obj;
// src is the raw input, which tells input failures from malformed content.
func applyTar(ctx context.Context, obj *objects, b *cas.Builder, r io.Reader, layer bool, opts Options, src *source) (Stats, error) {
	sk := newSink(ctx, obj, opts.Workers)
	a := &tarApplier{obj: obj, b: b, opts: opts, src: src, sink: sk, layer: layer, archive: &archiveCounter{r: r}}
	if layer {
		a.staged, a.above = map[string]bool{}, map[string]bool{}
	}
	err := sk.close(a.run(sk.ctx, tar.NewReader(a.archive)))
	if err != nil {
		return Stats{}, err
	}
	slices.Sort(a.s.Skipped)
	return a.s, nil
}

// tarApplier stages one tar stream, entry by entry and in order (later
// entries replace earlier ones, links need their target staged), on the
// caller's goroutine; only storing small content runs on the sink.
type tarApplier struct {
	obj     *objects
	archive *archiveCounter // what the tar reader read, for holes
	b       *cas.Builder
	opts    Options
	src     *source
	sink    *sink
	layer   bool
	s       Stats
	// Layer mode: the paths this layer staged and every directory above
	// one, so whiteouts can spare them.
	staged, above map[string]bool
}

func (a *tarApplier) run(ctx context.Context, tr *tar.Reader) error {
	for {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		// ErrInsecurePath (GODEBUG tarinsecurepath=0) comes with a usable
		// header; cleanName applies our own rule to the name.
		if err != nil && (hdr == nil || !errors.Is(err, tar.ErrInsecurePath)) {
			return a.src.classify("read tar", err)
		}
		if err := a.entry(ctx, tr, hdr); err != nil {
			return err
		}
	}
}

func (a *tarApplier) entry(ctx context.Context, tr *tar.Reader, hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // defaults for later headers; the reader applies none we need
	}
	p, err := cleanName(hdr.Name)
	if err != nil {
		return fmt.Errorf("tar entry: %w", err)
	}
	bad := func(err error) error { return fmt.Errorf("tar entry %q: %w", hdr.Name, err) }
	if a.layer {
		if done, err := a.whiteout(ctx, p); done || err != nil {
			return err
		}
	}
	attr, err := headerAttr(hdr)
	if err != nil {
		return bad(err)
	}
	e := cas.Entry{Attr: attr}
	switch hdr.Typeflag {
	case tar.TypeDir:
		e.Type = cas.TypeDir
	case tar.TypeReg, tar.TypeCont, tar.TypeGNUSparse:
		e.Type = cas.TypeFile
		if e.ID, e.Size, e.Holes, err = a.file(ctx, tr, hdr); err != nil {
			return err
		}
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil {
			return bad(err)
		}
		if target == "" {
			return bad(fmt.Errorf("hard link to the root: %w", cas.ErrInvalidArgument))
		}
		te, _, ok, err := a.b.Lookup(ctx, target)
		if err != nil {
			return bad(err)
		}
		if !ok {
			return bad(fmt.Errorf("hard link target %q not found: %w", hdr.Linkname, cas.ErrInvalidArgument))
		}
		if err := a.b.Link(ctx, p, target); err != nil {
			return bad(err)
		}
		a.s.count(te.Type)
		a.mark(p)
		return nil
	case tar.TypeSymlink:
		e.Type = cas.TypeSymlink
		e.Target = hdr.Linkname
		e.Mode = 0o777 // as Dir does: Linux ignores symlink modes
	case tar.TypeChar, tar.TypeBlock:
		e.Type = cas.TypeCharDev
		if hdr.Typeflag == tar.TypeBlock {
			e.Type = cas.TypeBlockDev
		}
		if e.Major, err = devNumber(hdr.Devmajor); err == nil {
			e.Minor, err = devNumber(hdr.Devminor)
		}
		if err != nil {
			return bad(err)
		}
	case tar.TypeFifo:
		e.Type = cas.TypeFIFO
	default:
		a.opts.Logger.Warn("import: skipping tar entry", "path", hdr.Name, "type", string(hdr.Typeflag))
		a.s.Skipped = append(a.s.Skipped, hdr.Name)
		return nil
	}
	if err := a.b.Put(ctx, p, e, ""); err != nil {
		return bad(err)
	}
	a.s.count(e.Type)
	a.mark(p)
	return nil
}

// file stores the content of the current member. Small members are read
// whole, hashed here and stored by the sink; larger ones are streamed
// into Put. A member the archive stores sparse gets its holes.
func (a *tarApplier) file(ctx context.Context, tr *tar.Reader, hdr *tar.Header) (cas.ID, int64, []cas.Hole, error) {
	var r io.Reader = tr
	var th *tarHoles
	if sparseMember(hdr) {
		th = &tarHoles{r: tr, archive: a.archive}
		r = th
	}
	holes := func(size int64) []cas.Hole {
		if th == nil {
			return nil
		}
		return th.result(size)
	}
	if hdr.Size <= smallFileMax {
		data := make([]byte, hdr.Size)
		if _, err := io.ReadFull(r, data); err != nil {
			return cas.ZeroID, 0, nil, a.src.classify(fmt.Sprintf("tar entry %q", hdr.Name), err)
		}
		id := cas.Sum(data)
		a.s.Bytes += hdr.Size
		if err := a.sink.submit(data, id); err != nil {
			return cas.ZeroID, 0, nil, err
		}
		return id, hdr.Size, holes(hdr.Size), nil
	}
	rec := &readRecorder{r: r}
	info, _, err := a.obj.put(ctx, rec)
	if err != nil {
		if rec.err != nil {
			return cas.ZeroID, 0, nil, a.src.classify(fmt.Sprintf("tar entry %q", hdr.Name), rec.err)
		}
		if ctx.Err() != nil {
			return cas.ZeroID, 0, nil, context.Cause(ctx)
		}
		return cas.ZeroID, 0, nil, fmt.Errorf("tar entry %q: store: %w", hdr.Name, err)
	}
	a.s.Bytes += info.Size
	return info.ID, info.Size, holes(info.Size), nil
}

// readRecorder remembers the first error of r, to tell a failing input
// from a failing store when Put returns an error.
type readRecorder struct {
	r   io.Reader
	err error
}

func (rr *readRecorder) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	if err != nil && err != io.EOF && rr.err == nil {
		rr.err = err
	}
	return n, err
}

// OCI whiteout names (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// whiteout applies p if it is a whiteout and reports whether it was one.
func (a *tarApplier) whiteout(ctx context.Context, p string) (bool, error) {
	dir, base := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	if !strings.HasPrefix(base, whiteoutPrefix) {
		return false, nil
	}
	if base == whiteoutOpaque {
		return true, a.hideLower(ctx, dir, true)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return true, nil
	}
	name := base[len(whiteoutPrefix):]
	if err := cas.ValidName(name); err != nil {
		return true, fmt.Errorf("whiteout %q: %w", p, err)
	}
	if dir != "" {
		name = dir + "/" + name
	}
	return true, a.hideLower(ctx, name, false)
}

// hideLower deletes p (or, with clear, empties directory p) as far as
// lower layers put it there: what this layer staged under p is put back.
func (a *tarApplier) hideLower(ctx context.Context, p string, clear bool) error {
	if !clear && a.staged[p] {
		return nil
	}
	type saved struct {
		p   string
		e   cas.Entry
		key string
	}
	var keep []saved
	if a.above[p] {
		prefix := p + "/"
		if p == "" {
			prefix = ""
		}
		var paths []string
		for q := range a.staged {
			if strings.HasPrefix(q, prefix) && q != p {
				paths = append(paths, q)
			}
		}
		// Parents sort before their children, so they are put back first.
		slices.Sort(paths)
		for _, q := range paths {
			e, key, ok, err := a.b.Lookup(ctx, q)
			if err != nil {
				return err
			}
			if ok {
				keep = append(keep, saved{q, e, key})
			}
		}
	}
	var err error
	if clear {
		err = a.b.Clear(ctx, p)
	} else {
		err = a.b.Delete(ctx, p)
	}
	if err != nil {
		return fmt.Errorf("whiteout %q: %w", p, err)
	}
	for _, k := range keep {
		if err := a.b.Put(ctx, k.p, k.e, k.key); err != nil {
			return fmt.Errorf("whiteout %q: restore %q: %w", p, k.p, err)
		}
	}
	return nil
}

// mark records, in layer mode, that this layer staged p.
func (a *tarApplier) mark(p string) {
	if !a.layer || a.staged[p] {
		return
	}
	a.staged[p] = true
	for q := p; q != ""; {
		i := strings.LastIndexByte(q, '/')
		if i < 0 {
			q = ""
		} else {
			q = q[:i]
		}
		if a.above[q] {
			break
		}
		a.above[q] = true
	}
}

// cleanName turns a tar member name into a Builder path: leading slashes
// and "./" go, "." and empty components go, ".." removes the previous
// component. A ".." that would climb above the root is ErrInvalidArgument:
// clamping it would silently put content somewhere the archive did not say.
func cleanName(name string) (string, error) {
	var parts []string
	for c := range strings.SplitSeq(name, "/") {
		switch c {
		case "", ".":
		case "..":
			if len(parts) == 0 {
				return "", fmt.Errorf("name %q escapes the root: %w", name, cas.ErrInvalidArgument)
			}
			parts = parts[:len(parts)-1]
		default:
			parts = append(parts, c)
		}
	}
	return strings.Join(parts, "/"), nil
}

// PAX record prefixes that carry xattrs: GNU tar and Go write SCHILY,
// bsdtar writes both (LIBARCHIVE's with URL-encoded names, base64 values).
const (
	paxSchilyXattr     = "SCHILY.xattr."
	paxLibarchiveXattr = "LIBARCHIVE.xattr."
)

func headerAttr(hdr *tar.Header) (cas.Attr, error) {
	if hdr.Uid < 0 || int64(hdr.Uid) > math.MaxUint32 || hdr.Gid < 0 || int64(hdr.Gid) > math.MaxUint32 {
		return cas.Attr{}, fmt.Errorf("uid %d or gid %d out of range: %w", hdr.Uid, hdr.Gid, cas.ErrInvalidArgument)
	}
	a := cas.Attr{
		Mode:    uint32(hdr.Mode) & cas.ModeMask,
		UID:     uint32(hdr.Uid),
		GID:     uint32(hdr.Gid),
		MtimeNs: timeNs(hdr.ModTime.Unix(), int64(hdr.ModTime.Nanosecond())),
	}
	var xs map[string][]byte
	set := func(name string, v []byte) {
		if xs == nil {
			xs = map[string][]byte{}
		}
		xs[name] = v
	}
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, paxSchilyXattr); ok {
			set(name, []byte(v))
		}
	}
	for k, v := range hdr.PAXRecords {
		enc, ok := strings.CutPrefix(k, paxLibarchiveXattr)
		if !ok {
			continue
		}
		name, err := url.PathUnescape(enc)
		if err != nil {
			return cas.Attr{}, fmt.Errorf("xattr record %q: %v: %w", k, err, cas.ErrInvalidArgument)
		}
		if _, dup := xs[name]; dup {
			continue
		}
		val, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(v, "="))
		if err != nil {
			return cas.Attr{}, fmt.Errorf("xattr record %q: %v: %w", k, err, cas.ErrInvalidArgument)
		}
		set(name, val)
	}
	for name, v := range xs {
		a.Xattrs = append(a.Xattrs, cas.Xattr{Name: name, Value: v})
	}
	cas.SortXattrs(a.Xattrs)
	return a, nil
}

func devNumber(n int64) (uint32, error) {
	if n < 0 || n > math.MaxUint32 {
		return 0, fmt.Errorf("device number %d out of range: %w", n, cas.ErrInvalidArgument)
	}
	return uint32(n), nil
}
