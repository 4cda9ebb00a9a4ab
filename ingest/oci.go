package ingest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/containerd/v2/plugins/content/local"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/esf-dev/esf/cas"
)

// OCILayout imports the image in the OCI image layout directory dir: the
// manifest for opts.Platform (the first match when index.json names
// several images), its layers applied in order with whiteouts. The layout
// is only read. Every blob is checked against its digest and every layer
// against its diff id; a mismatch is ErrCorrupt.
func OCILayout(ctx context.Context, st Store, dir string, opts Options) (Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Result{}, err
	}
	lp, top, err := openLayout(dir)
	if err != nil {
		return Result{}, err
	}
	res, err := applyImage(ctx, st, lp, top, opts, newProgress(opts.Progress))
	if err != nil {
		return Result{}, fmt.Errorf("import OCI layout %s: %w", dir, err)
	}
	logDone(opts.Logger, "oci layout", dir, res.Root, &res.Stats)
	return res, nil
}

// OCIArchive imports the image in file: an OCI layout in a tar, or the
// output of `docker save`, possibly gzip or zstd compressed. containerd's
// importer unpacks it into a scratch content store under opts.TempDir,
// removed before OCIArchive returns; then it is applied as OCILayout does.
// Progress counts archive bytes, then layer bytes.
func OCIArchive(ctx context.Context, st Store, file string, opts Options) (Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Result{}, err
	}
	f, err := os.Open(file)
	if err != nil {
		return Result{}, fsError("import", file, err)
	}
	defer f.Close()
	prog := newProgress(opts.Progress)
	src := &source{ctx: ctx, r: f, prog: prog}
	r, closeFn, err := decompress(src)
	if err != nil {
		return Result{}, fmt.Errorf("import %s: %w", file, err)
	}
	defer closeFn()
	tmp, err := os.MkdirTemp(opts.TempDir, "esf-import-*")
	if err != nil {
		return Result{}, fmt.Errorf("import %s: scratch store: %w", file, err)
	}
	defer os.RemoveAll(tmp)
	cs, err := local.NewStore(tmp)
	if err != nil {
		return Result{}, fmt.Errorf("import %s: scratch store: %w", file, err)
	}
	top, err := archive.ImportIndex(ctx, cs, r)
	if err != nil {
		if ctx.Err() != nil || src.inputErr() != nil {
			return Result{}, src.classify("import "+file, err)
		}
		return Result{}, fmt.Errorf("import %s: %w", file, imageError(err))
	}
	res, err := applyImage(ctx, st, cs, top, opts, prog)
	if err != nil {
		return Result{}, fmt.Errorf("import %s: %w", file, err)
	}
	logDone(opts.Logger, "oci archive", file, res.Root, &res.Stats)
	return res, nil
}

// maxMetaBlob bounds index, manifest and config blobs, which are read whole.
const maxMetaBlob = 16 << 20

func applyImage(ctx context.Context, st Store, prov content.Provider, top ocispec.Descriptor, opts Options, prog *progress) (Result, error) {
	match := platforms.Default()
	if opts.Platform != "" {
		p, err := platforms.Parse(opts.Platform)
		if err != nil {
			return Result{}, fmt.Errorf("platform %q: %v: %w", opts.Platform, err, cas.ErrInvalidArgument)
		}
		match = platforms.Only(p)
	}
	meta := verifiedProvider{prov}
	m, err := images.Manifest(ctx, meta, top, match)
	if err != nil {
		return Result{}, fmt.Errorf("resolve manifest: %w", imageError(err))
	}
	raw, err := content.ReadBlob(ctx, meta, m.Config)
	if err != nil {
		return Result{}, fmt.Errorf("read config: %w", imageError(err))
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return Result{}, fmt.Errorf("config %s: %v: %w", m.Config.Digest, err, cas.ErrInvalidArgument)
	}
	if len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return Result{}, fmt.Errorf("config lists %d diff ids for %d layers: %w",
			len(cfg.RootFS.DiffIDs), len(m.Layers), cas.ErrInvalidArgument)
	}
	obj := newObjects(st)
	defer obj.abort()
	b := cas.NewBuilder(st, cas.ZeroID)
	var s Stats
	for i, l := range m.Layers {
		ls, err := applyLayer(ctx, obj, b, prov, l, cfg.RootFS.DiffIDs[i], opts, prog)
		if err != nil {
			return Result{}, fmt.Errorf("layer %d (%s): %w", i, l.Digest, err)
		}
		s.add(ls)
	}
	prog.done()
	id, err := obj.finish(ctx, b, &s)
	if err != nil {
		return Result{}, err
	}
	return Result{Root: id, Stats: s}, nil
}

// applyLayer applies one layer blob to b. The compressed bytes are checked
// against the layer digest and the uncompressed ones against the config's
// diff id, both read to the end. A mismatch surfaces after the entries
// were staged; the caller then drops the Builder, and the blobs already
// stored are unreferenced garbage, never part of a root.
func applyLayer(ctx context.Context, obj *objects, b *cas.Builder, prov content.Provider, l ocispec.Descriptor,
	diffID digest.Digest, opts Options, prog *progress) (Stats, error) {
	if !images.IsLayerType(l.MediaType) {
		return Stats{}, fmt.Errorf("media type %q is not a layer: %w", l.MediaType, cas.ErrUnsupported)
	}
	if _, err := images.DiffCompression(ctx, l.MediaType); err != nil {
		return Stats{}, fmt.Errorf("media type %q: %v: %w", l.MediaType, err, cas.ErrUnsupported)
	}
	// containerd accepts wrapped types ("+encrypted") it cannot open itself.
	if _, suffixes, _ := strings.Cut(l.MediaType, "+"); suffixes != "" && suffixes != "gzip" && suffixes != "zstd" {
		return Stats{}, fmt.Errorf("media type %q: %w", l.MediaType, cas.ErrUnsupported)
	}
	if err := l.Digest.Validate(); err != nil {
		return Stats{}, fmt.Errorf("digest: %v: %w", err, cas.ErrInvalidArgument)
	}
	if err := diffID.Validate(); err != nil {
		return Stats{}, fmt.Errorf("diff id: %v: %w", err, cas.ErrInvalidArgument)
	}
	ra, err := prov.ReaderAt(ctx, l)
	if err != nil {
		return Stats{}, imageError(err)
	}
	defer ra.Close()
	if ra.Size() != l.Size {
		return Stats{}, fmt.Errorf("blob has %d bytes, descriptor says %d: %w", ra.Size(), l.Size, cas.ErrCorrupt)
	}
	packed := l.Digest.Algorithm().Digester()
	src := &source{ctx: ctx, r: io.TeeReader(content.NewReader(ra), packed.Hash()), prog: prog}
	verify := func() error {
		if _, err := io.Copy(io.Discard, src); err != nil {
			return src.classify("read layer", err)
		}
		if src.n.Load() != l.Size || packed.Digest() != l.Digest {
			return fmt.Errorf("blob content does not match its digest: %w", cas.ErrCorrupt)
		}
		return nil
	}
	ds, err := compression.DecompressStream(src)
	if err != nil {
		if verr := verify(); verr != nil {
			return Stats{}, verr
		}
		return Stats{}, src.classify("decompress layer", err)
	}
	// Closed before verify drains src: a zstd decoder reads ahead from
	// its own goroutine, and src must have one reader at a time.
	defer ds.Close()
	unpacked := diffID.Algorithm().Digester()
	tr := io.TeeReader(ds, unpacked.Hash())
	lopts := opts
	lopts.Progress = nil // src reports progress
	s, err := applyTar(ctx, obj, b, tr, true, lopts, src)
	if err == nil {
		if _, err = io.Copy(io.Discard, tr); err != nil {
			err = src.classify("read layer", err)
		}
	}
	ds.Close()
	if err != nil {
		// Malformed content in a blob that fails its digest is corruption.
		if errors.Is(err, cas.ErrInvalidArgument) {
			if verr := verify(); verr != nil {
				return Stats{}, verr
			}
		}
		return Stats{}, err
	}
	if err := verify(); err != nil {
		return Stats{}, err
	}
	if unpacked.Digest() != diffID {
		return Stats{}, fmt.Errorf("uncompressed layer does not match diff id %s: %w", diffID, cas.ErrCorrupt)
	}
	return s, nil
}

// imageError gives containerd's errors our classes. Whatever is not a
// known class, an I/O failure or cancellation is a defect of the image.
func imageError(err error) error {
	var pe *fs.PathError
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, cas.ErrCorrupt), errors.Is(err, cas.ErrInvalidArgument),
		errors.Is(err, cas.ErrUnsupported), errors.Is(err, cas.ErrNotFound), errors.As(err, &pe):
		return err
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%v: %w", err, cas.ErrNotFound)
	case cerrdefs.IsNotImplemented(err):
		return fmt.Errorf("%v: %w", err, cas.ErrUnsupported)
	}
	return fmt.Errorf("%v: %w", err, cas.ErrInvalidArgument)
}

// layoutProvider serves the blobs of an OCI layout directory, whose
// blobs/<alg>/<hex> tree is the one containerd's local store keeps, through
// containerd's reader; index.json, which lives outside blobs/, is served
// from memory under its digest. It writes nothing into the layout.
type layoutProvider struct {
	dir         string
	index       []byte
	indexDigest digest.Digest
}

func openLayout(dir string) (*layoutProvider, ocispec.Descriptor, error) {
	raw, err := readSmall(filepath.Join(dir, ocispec.ImageLayoutFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ocispec.Descriptor{}, fmt.Errorf("import %s: no %s: not an OCI layout: %w",
				dir, ocispec.ImageLayoutFile, cas.ErrInvalidArgument)
		}
		return nil, ocispec.Descriptor{}, fmt.Errorf("import %s: %w", dir, err)
	}
	var lay ocispec.ImageLayout
	if err := json.Unmarshal(raw, &lay); err != nil {
		return nil, ocispec.Descriptor{}, fmt.Errorf("import %s: %s: %v: %w", dir, ocispec.ImageLayoutFile, err, cas.ErrInvalidArgument)
	}
	if lay.Version != ocispec.ImageLayoutVersion {
		return nil, ocispec.Descriptor{}, fmt.Errorf("import %s: layout version %q: %w", dir, lay.Version, cas.ErrUnsupported)
	}
	idx, err := readSmall(filepath.Join(dir, ocispec.ImageIndexFile))
	if err != nil {
		return nil, ocispec.Descriptor{}, fmt.Errorf("import %s: %w", dir, fsError("read", ocispec.ImageIndexFile, err))
	}
	lp := &layoutProvider{dir: dir, index: idx, indexDigest: digest.FromBytes(idx)}
	return lp, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: lp.indexDigest, Size: int64(len(idx))}, nil
}

func readSmall(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMetaBlob+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxMetaBlob {
		return nil, fmt.Errorf("%s: over %d bytes: %w", p, maxMetaBlob, cas.ErrInvalidArgument)
	}
	return b, nil
}

func (lp *layoutProvider) ReaderAt(ctx context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	if desc.Digest == lp.indexDigest {
		return memBlob{bytes.NewReader(lp.index)}, nil
	}
	// Validate keeps the digest to a known algorithm and hex, so the path
	// below stays inside blobs/.
	if err := desc.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("digest %q: %v: %w", desc.Digest, err, cas.ErrInvalidArgument)
	}
	p := filepath.Join(lp.dir, "blobs", desc.Digest.Algorithm().String(), desc.Digest.Encoded())
	return local.OpenReader(p)
}

type memBlob struct{ *bytes.Reader }

func (memBlob) Close() error { return nil }

// verifiedProvider reads metadata blobs whole and checks them against
// their digest before containerd's image code parses them (containerd's
// readers do not verify). Layers are verified while streaming instead.
type verifiedProvider struct{ p content.Provider }

func (v verifiedProvider) ReaderAt(ctx context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	if err := desc.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("digest %q: %v: %w", desc.Digest, err, cas.ErrInvalidArgument)
	}
	ra, err := v.p.ReaderAt(ctx, desc)
	if err != nil {
		return nil, imageError(err)
	}
	defer ra.Close()
	n := ra.Size()
	if n > maxMetaBlob {
		return nil, fmt.Errorf("blob %s: %d bytes is too large for metadata: %w", desc.Digest, n, cas.ErrInvalidArgument)
	}
	if desc.Size != 0 && n != desc.Size {
		return nil, fmt.Errorf("blob %s has %d bytes, descriptor says %d: %w", desc.Digest, n, desc.Size, cas.ErrCorrupt)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(io.NewSectionReader(ra, 0, n), b); err != nil {
		return nil, fmt.Errorf("read blob %s: %w", desc.Digest, err)
	}
	if desc.Digest.Algorithm().FromBytes(b) != desc.Digest {
		return nil, fmt.Errorf("blob %s: content does not match its digest: %w", desc.Digest, cas.ErrCorrupt)
	}
	return memBlob{bytes.NewReader(b)}, nil
}

// isImageArchive reports whether file is a tar (possibly compressed) that
// holds an image: an OCI layout (oci-layout and index.json) or a docker
// save (manifest.json). Any member outside the shapes those archives take
// ends the scan early with false, so a plain tar that happens to carry a
// manifest.json is imported as a tar.
func isImageArchive(ctx context.Context, file string) (bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return false, fsError("import", file, err)
	}
	defer f.Close()
	var magic [10]byte
	n, _ := f.ReadAt(magic[:], 0)
	// A plain file goes to tar as is, so it seeks over member content.
	var r io.Reader = f
	if compressed(magic[:n]) {
		src := &source{ctx: ctx, r: f}
		dr, closeFn, err := decompress(src)
		if err != nil {
			return false, nil // Tar reports it
		}
		defer closeFn()
		r = dr
	}
	tr := tar.NewReader(r)
	var layout, index, manifest bool
	for {
		if err := ctx.Err(); err != nil {
			return false, context.Cause(ctx)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return false, nil // not a tar we can read: Tar reports it
		}
		name, err := cleanName(hdr.Name)
		if err != nil || !imageMember(name) {
			return false, nil
		}
		switch name {
		case ocispec.ImageLayoutFile:
			var lay ocispec.ImageLayout
			layout = json.NewDecoder(io.LimitReader(tr, maxMetaBlob)).Decode(&lay) == nil && lay.Version != ""
		case ocispec.ImageIndexFile:
			index = true
		case "manifest.json":
			var ms []struct {
				Config string
				Layers []string
			}
			manifest = json.NewDecoder(io.LimitReader(tr, maxMetaBlob)).Decode(&ms) == nil &&
				len(ms) > 0 && ms[0].Config != ""
		}
	}
	return (layout && index) || manifest, nil
}

func compressed(magic []byte) bool {
	return bytes.HasPrefix(magic, magicGzip) || bytes.HasPrefix(magic, magicZstd)
}

// imageMember reports whether name can be part of an OCI or docker image
// archive: top-level files, blobs/..., and docker's <64 hex>/<file>.
func imageMember(name string) bool {
	first, rest, nested := strings.Cut(name, "/")
	if !nested || first == "blobs" {
		return true
	}
	return len(first) == 64 && strings.Trim(first, "0123456789abcdef") == "" && !strings.Contains(rest, "/")
}

// Path imports whatever p is: a directory holding an oci-layout file is an
// OCI layout, any other directory is imported with Dir; a file is an image
// archive (OCIArchive) when its members make one, else a tar.
func Path(ctx context.Context, st Store, p string, opts Options) (Result, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return Result{}, fsError("import", p, err)
	}
	switch {
	case fi.IsDir():
		if _, err := os.Lstat(filepath.Join(p, ocispec.ImageLayoutFile)); err == nil {
			return OCILayout(ctx, st, p, opts)
		}
		return Dir(ctx, st, p, opts)
	case fi.Mode().IsRegular():
		img, err := isImageArchive(ctx, p)
		if err != nil {
			return Result{}, err
		}
		if img {
			return OCIArchive(ctx, st, p, opts)
		}
		f, err := os.Open(p)
		if err != nil {
			return Result{}, fsError("import", p, err)
		}
		defer f.Close()
		res, err := Tar(ctx, st, f, opts)
		if err != nil {
			return Result{}, fmt.Errorf("import %s: %w", p, err)
		}
		return res, nil
	}
	return Result{}, fmt.Errorf("import %s: %s is neither a directory nor a file: %w", p, fi.Mode().Type(), cas.ErrInvalidArgument)
}
