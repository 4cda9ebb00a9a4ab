package ingest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/esf-dev/esf/cas"
)

// FuzzOCIArchive feeds arbitrary bytes to OCIArchive as an image archive
// (an OCI layout in a tar, or what `docker save` writes): the index,
// manifest and config decoders and the digest checks behind them. Nothing
// may panic, every error must say the input is malformed, unsupported,
// incomplete or corrupt, an accepted image reads back as valid trees, and
// the scratch store is gone afterwards.
func FuzzOCIArchive(f *testing.F) {
	small := f.TempDir()
	writeIndex(f, small, writeImage(f, small, runtime.GOARCH, layerSpec{data: makeTar(f, file("a", "x"))}))
	f.Add(tarDir(f, small))
	f.Add(tarDir(f, testLayout(f)))
	f.Add(dockerSave(f))
	f.Add([]byte{})
	f.Add(makeTar(f, file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`), file("index.json", `{"schemaVersion":2,"manifests":[{}]}`)))
	f.Add(makeTar(f, file("manifest.json", `[{"Config":"c.json","Layers":["l.tar"]}]`), file("c.json", `{}`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "image.tar")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		scratch := filepath.Join(dir, "scratch")
		if err := os.Mkdir(scratch, 0o755); err != nil {
			t.Fatal(err)
		}
		st := &cappedStore{Store: newStore()}
		res, err := OCIArchive(context.Background(), st, p, Options{TempDir: scratch, Workers: 2})
		switch {
		case err == nil:
			flatten(t, st, res.Root)
		case !errors.Is(err, cas.ErrInvalidArgument) && !errors.Is(err, cas.ErrUnsupported) && !errors.Is(err, cas.ErrNotFound) &&
			!errors.Is(err, cas.ErrCorrupt) && !errors.Is(err, errTooBig):
			t.Fatalf("unclassified error: %v", err)
		}
		if left, _ := os.ReadDir(scratch); len(left) != 0 {
			t.Fatalf("scratch store left behind: %v", left)
		}
	})
}
