package ingest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/esf-dev/esf/cas"
)

// Layers of the test image: the second whites out etc/a and gone/, and
// makes opq/ opaque after adding opq/mine to it.
func testLayers(t testing.TB) (l1, l2 []byte) {
	l1 = makeTar(t,
		dir("etc/"), file("etc/a", "a"), file("etc/b", "b"),
		dir("opq/"), file("opq/x", "x"), dir("opq/sub/"), file("opq/sub/y", "y"),
		dir("gone/"), file("gone/z", "z"), file("keep", "k"))
	opq := dir("opq/")
	opq.hdr.Mode = 0o700
	l2 = makeTar(t,
		file("etc/.wh.a", ""),
		opq, file("opq/mine", "mine"), file("opq/.wh..wh..opq", ""), file("opq/new", "new"),
		file(".wh.gone", ""))
	return l1, l2
}

// flatLayers is what testLayers stack up to, as one tar.
func flatLayers(t testing.TB) []byte {
	opq := dir("opq/")
	opq.hdr.Mode = 0o700
	return makeTar(t, dir("etc/"), file("etc/b", "b"), opq, file("opq/mine", "mine"), file("opq/new", "new"), file("keep", "k"))
}

type layerSpec struct {
	data     []byte // uncompressed tar
	compress string // "gzip", "zstd" or ""
	diffID   digest.Digest
}

func writeBlob(t testing.TB, layout, mediaType string, b []byte) ocispec.Descriptor {
	t.Helper()
	d := digest.FromBytes(b)
	p := filepath.Join(layout, "blobs", d.Algorithm().String(), d.Encoded())
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, b, 0o644))
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
}

func compressLayer(t testing.TB, data []byte, how string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	switch how {
	case "gzip":
		zw := gzip.NewWriter(&buf)
		zw.Write(data)
		must(t, zw.Close())
		return buf.Bytes(), ocispec.MediaTypeImageLayerGzip
	case "zstd":
		zw, err := zstd.NewWriter(&buf)
		must(t, err)
		zw.Write(data)
		must(t, zw.Close())
		return buf.Bytes(), ocispec.MediaTypeImageLayerZstd
	}
	return data, ocispec.MediaTypeImageLayer
}

// writeImage writes config, layers and manifest blobs into layout and
// returns the manifest's descriptor.
func writeImage(t testing.TB, layout, arch string, layers ...layerSpec) ocispec.Descriptor {
	t.Helper()
	cfg := ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: arch},
		RootFS:   ocispec.RootFS{Type: "layers"},
	}
	m := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest}
	for _, l := range layers {
		blob, mt := compressLayer(t, l.data, l.compress)
		m.Layers = append(m.Layers, writeBlob(t, layout, mt, blob))
		id := l.diffID
		if id == "" {
			id = digest.FromBytes(l.data)
		}
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, id)
	}
	raw, err := json.Marshal(cfg)
	must(t, err)
	m.Config = writeBlob(t, layout, ocispec.MediaTypeImageConfig, raw)
	raw, err = json.Marshal(m)
	must(t, err)
	return writeBlob(t, layout, ocispec.MediaTypeImageManifest, raw)
}

func writeIndex(t testing.TB, layout string, manifests ...ocispec.Descriptor) {
	t.Helper()
	raw, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	must(t, err)
	must(t, os.WriteFile(filepath.Join(layout, ocispec.ImageLayoutFile), raw, 0o644))
	idx := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: manifests}
	raw, err = json.Marshal(idx)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(layout, ocispec.ImageIndexFile), raw, 0o644))
}

// testLayout builds the two-layer test image (gzip, then zstd) as a layout.
func testLayout(t testing.TB) string {
	t.Helper()
	layout := t.TempDir()
	l1, l2 := testLayers(t)
	m := writeImage(t, layout, runtime.GOARCH, layerSpec{data: l1, compress: "gzip"}, layerSpec{data: l2, compress: "zstd"})
	writeIndex(t, layout, m)
	return layout
}

// tarDir archives the files of dir (as an OCI archive holds a layout).
func tarDir(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	}))
	must(t, tw.Close())
	return buf.Bytes()
}

func TestOCILayout(t *testing.T) {
	noLeaks(t)
	layout := testLayout(t)
	st := newStore()
	ctx := context.Background()
	res, err := OCILayout(ctx, st, layout, Options{})
	if err != nil {
		t.Fatal(err)
	}
	es := flatten(t, st, res.Root)
	want := []string{"", "etc", "etc/b", "keep", "opq", "opq/mine", "opq/new"}
	if got := keys(es); !slices.Equal(got, want) {
		t.Fatalf("paths %q\nwant  %q", got, want)
	}
	// The layers stack up to exactly the flattened tar.
	flat, err := Tar(ctx, st, bytes.NewReader(flatLayers(t)), Options{})
	must(t, err)
	if flat.Root != res.Root {
		diffTrees(t, st, flat.Root, res.Root)
		t.Fatal("OCI layout and its flattened tar differ")
	}
	// Both layers' entries were applied.
	if res.Files != 8 {
		t.Errorf("Files = %d, want 8 (6 + 2 across layers)", res.Files)
	}
	st.ResetStats()
	again, err := OCILayout(ctx, st, layout, Options{})
	must(t, err)
	if again.Root != res.Root || again.NewObjects != 0 || st.Stats().Put != 0 {
		t.Errorf("re-import: root %s vs %s, new %d, puts %d", again.Root.Short(), res.Root.Short(), again.NewObjects, st.Stats().Put)
	}
	// The layout was only read.
	if _, err := os.Stat(filepath.Join(layout, "ingest")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("import wrote into the layout: %v", err)
	}
}

func TestOCIArchive(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	st := newStore()
	layout := testLayout(t)
	want, err := OCILayout(ctx, st, layout, Options{})
	must(t, err)

	work := t.TempDir()
	ociTar := filepath.Join(work, "oci.tar")
	must(t, os.WriteFile(ociTar, tarDir(t, layout), 0o644))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarDir(t, layout))
	must(t, zw.Close())
	ociTgz := filepath.Join(work, "oci.tar.gz")
	must(t, os.WriteFile(ociTgz, gz.Bytes(), 0o644))
	dockerTar := filepath.Join(work, "docker.tar")
	must(t, os.WriteFile(dockerTar, dockerSave(t), 0o644))

	for _, file := range []string{ociTar, ociTgz, dockerTar} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			scratch := t.TempDir()
			var last int64
			got, err := OCIArchive(ctx, st, file, Options{TempDir: scratch, Progress: func(n int64) { last = n }})
			if err != nil {
				t.Fatal(err)
			}
			if got.Root != want.Root {
				diffTrees(t, st, want.Root, got.Root)
				t.Fatalf("root %s, layout gave %s", got.Root.Short(), want.Root.Short())
			}
			if left, _ := os.ReadDir(scratch); len(left) != 0 {
				t.Errorf("scratch store left behind: %v", left)
			}
			if fi, _ := os.Stat(file); last < fi.Size() {
				t.Errorf("progress ended at %d, archive has %d bytes", last, fi.Size())
			}
		})
	}
}

// dockerSave builds what `docker save` wrote before Docker 25: manifest.json,
// a config named by its hex digest, and uncompressed <id>/layer.tar files.
func dockerSave(t testing.TB) []byte {
	t.Helper()
	l1, l2 := testLayers(t)
	cfg := ocispec.Image{
		Platform: ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(l1), digest.FromBytes(l2)}},
	}
	raw, err := json.Marshal(cfg)
	must(t, err)
	cfgName := digest.FromBytes(raw).Encoded() + ".json"
	n1 := digest.FromBytes(l1).Encoded() + "/layer.tar"
	n2 := digest.FromBytes(l2).Encoded() + "/layer.tar"
	mf, err := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{"esf/test:latest"}, "Layers": []string{n1, n2}}})
	must(t, err)
	return makeTar(t,
		tarEntry{hdr: tar.Header{Name: cfgName, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(raw))}, body: string(raw)},
		tarEntry{hdr: tar.Header{Name: n1, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(l1))}, body: string(l1)},
		tarEntry{hdr: tar.Header{Name: n2, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(l2))}, body: string(l2)},
		tarEntry{hdr: tar.Header{Name: "manifest.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(mf))}, body: string(mf)},
	)
}

func TestPath(t *testing.T) {
	ctx := context.Background()
	st := newStore()
	layout := testLayout(t)
	img, err := OCILayout(ctx, st, layout, Options{})
	must(t, err)

	work := t.TempDir()
	ociTar := filepath.Join(work, "oci.tar")
	must(t, os.WriteFile(ociTar, tarDir(t, layout), 0o644))
	dockerTar := filepath.Join(work, "docker.tar")
	must(t, os.WriteFile(dockerTar, dockerSave(t), 0o644))
	// A plain tar that carries a manifest.json among other things.
	plainData := makeTar(t, file("manifest.json", `[{"Config":"c.json","Layers":[]}]`), file("src/main.go", "package main"))
	plainTar := filepath.Join(work, "plain.tar")
	must(t, os.WriteFile(plainTar, plainData, 0o644))
	plain, err := Tar(ctx, st, bytes.NewReader(plainData), Options{})
	must(t, err)
	tree := filepath.Join(work, "tree")
	writeFile(t, filepath.Join(tree, "x"), []byte("x"), 0o644)
	dirRes, err := Dir(ctx, st, tree, Options{})
	must(t, err)

	for _, tc := range []struct {
		path string
		want cas.ID
	}{{layout, img.Root}, {ociTar, img.Root}, {dockerTar, img.Root}, {plainTar, plain.Root}, {tree, dirRes.Root}} {
		got, err := Path(ctx, st, tc.path, Options{TempDir: work})
		if err != nil {
			t.Errorf("Path(%s): %v", tc.path, err)
			continue
		}
		if got.Root != tc.want {
			t.Errorf("Path(%s) = %s, want %s", tc.path, got.Root.Short(), tc.want.Short())
		}
	}
	if _, err := Path(ctx, st, filepath.Join(work, "missing"), Options{}); !errors.Is(err, cas.ErrNotFound) {
		t.Errorf("missing path: %v", err)
	}
}

func TestOCIPlatform(t *testing.T) {
	ctx := context.Background()
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	layout := t.TempDir()
	host := writeImage(t, layout, runtime.GOARCH, layerSpec{data: makeTar(t, file("arch", runtime.GOARCH)), compress: "gzip"})
	host.Platform = &ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	foreign := writeImage(t, layout, other, layerSpec{data: makeTar(t, file("arch", other)), compress: "gzip"})
	foreign.Platform = &ocispec.Platform{OS: "linux", Architecture: other}
	writeIndex(t, layout, foreign, host)
	st := newStore()
	for _, tc := range []struct {
		platform, want string
	}{{"", runtime.GOARCH}, {"linux/" + other, other}, {"linux/" + runtime.GOARCH, runtime.GOARCH}} {
		res, err := OCILayout(ctx, st, layout, Options{Platform: tc.platform})
		if err != nil {
			t.Fatalf("platform %q: %v", tc.platform, err)
		}
		if got := string(blobOf(t, st, flatten(t, st, res.Root)["arch"].ID)); got != tc.want {
			t.Errorf("platform %q picked %s, want %s", tc.platform, got, tc.want)
		}
	}
	if _, err := OCILayout(ctx, st, layout, Options{Platform: "windows/amd64"}); !errors.Is(err, cas.ErrNotFound) {
		t.Errorf("no matching platform: %v", err)
	}
	if _, err := OCILayout(ctx, st, layout, Options{Platform: "not a/platform/at/all"}); !errors.Is(err, cas.ErrInvalidArgument) {
		t.Errorf("bad platform: %v", err)
	}
}

func TestOCIBroken(t *testing.T) {
	ctx := context.Background()
	blobPath := func(layout string, d digest.Digest) string {
		return filepath.Join(layout, "blobs", d.Algorithm().String(), d.Encoded())
	}
	manifestOf := func(t *testing.T, layout string, m ocispec.Descriptor) ocispec.Manifest {
		raw, err := os.ReadFile(blobPath(layout, m.Digest))
		must(t, err)
		var mf ocispec.Manifest
		must(t, json.Unmarshal(raw, &mf))
		return mf
	}
	l1, _ := testLayers(t)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, layout string) // breaks a good one-layer layout
		want  error
	}{
		{"layer bytes flipped", func(t *testing.T, layout string) {
			m := writeImage(t, layout, runtime.GOARCH, layerSpec{data: l1, compress: "gzip"})
			writeIndex(t, layout, m)
			p := blobPath(layout, manifestOf(t, layout, m).Layers[0].Digest)
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 1
			must(t, os.WriteFile(p, b, 0o644))
		}, cas.ErrCorrupt},
		{"layer trailer flipped", func(t *testing.T, layout string) {
			m := writeImage(t, layout, runtime.GOARCH, layerSpec{data: l1, compress: ""})
			writeIndex(t, layout, m)
			p := blobPath(layout, manifestOf(t, layout, m).Layers[0].Digest)
			b, _ := os.ReadFile(p)
			b[len(b)-1] ^= 1 // in the tar's zero padding, after its last entry
			must(t, os.WriteFile(p, b, 0o644))
		}, cas.ErrCorrupt},
		{"wrong diff id", func(t *testing.T, layout string) {
			writeIndex(t, layout, writeImage(t, layout, runtime.GOARCH,
				layerSpec{data: l1, compress: "gzip", diffID: digest.FromString("other")}))
		}, cas.ErrCorrupt},
		{"manifest edited", func(t *testing.T, layout string) {
			m := writeImage(t, layout, runtime.GOARCH, layerSpec{data: l1, compress: "gzip"})
			writeIndex(t, layout, m)
			p := blobPath(layout, m.Digest)
			b, _ := os.ReadFile(p)
			must(t, os.WriteFile(p, bytes.Replace(b, []byte(`"schemaVersion":2`), []byte(`"schemaVersion":3`), 1), 0o644))
		}, cas.ErrCorrupt},
		{"missing layer", func(t *testing.T, layout string) {
			m := writeImage(t, layout, runtime.GOARCH, layerSpec{data: l1, compress: "gzip"})
			writeIndex(t, layout, m)
			must(t, os.Remove(blobPath(layout, manifestOf(t, layout, m).Layers[0].Digest)))
		}, cas.ErrNotFound},
		{"no oci-layout", func(t *testing.T, layout string) {}, cas.ErrInvalidArgument},
		{"encrypted layer", func(t *testing.T, layout string) {
			m := writeImage(t, layout, runtime.GOARCH, layerSpec{data: l1, compress: "gzip"})
			mf := manifestOf(t, layout, m)
			mf.Layers[0].MediaType += "+encrypted"
			raw, _ := json.Marshal(mf)
			writeIndex(t, layout, writeBlob(t, layout, ocispec.MediaTypeImageManifest, raw))
		}, cas.ErrUnsupported},
		{"garbage layer", func(t *testing.T, layout string) {
			writeIndex(t, layout, writeImage(t, layout, runtime.GOARCH,
				layerSpec{data: bytes.Repeat([]byte("garbage!"), 200), compress: "gzip"}))
		}, cas.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			noLeaks(t)
			layout := t.TempDir()
			tc.setup(t, layout)
			_, err := OCILayout(ctx, newStore(), layout, Options{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestOCICancel(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := OCILayout(ctx, newStore(), testLayout(t), Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("layout: %v", err)
	}
	file := filepath.Join(t.TempDir(), "docker.tar")
	must(t, os.WriteFile(file, dockerSave(t), 0o644))
	if _, err := OCIArchive(ctx, newStore(), file, Options{TempDir: t.TempDir()}); !errors.Is(err, context.Canceled) {
		t.Errorf("archive: %v", err)
	}
}
