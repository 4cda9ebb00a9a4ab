package ingest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
)

// FuzzTar feeds arbitrary bytes to Tar and, as an image layer over a base,
// to ApplyTar. Nothing may panic, and with an in-memory store and an input
// that never fails, every error must say the input is malformed or
// unsupported.
func FuzzTar(f *testing.F) {
	seed := makeTar(f,
		dir("./"), file("a", "hello"), dir("d/"), file("d/b", "world"),
		tarEntry{hdr: tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "a"}},
		tarEntry{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "a"}},
		tarEntry{hdr: tar.Header{Name: "c", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		tarEntry{hdr: tar.Header{Name: "x", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"SCHILY.xattr.user.a": "v"}}},
	)
	layer := makeTar(f, file("d/.wh.b", ""), file("d/.wh..wh..opq", ""), file(".wh.a", ""), file("n", "new"))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(seed)
	zw.Close()
	var zs bytes.Buffer
	enc, _ := zstd.NewWriter(&zs)
	enc.Write(layer)
	enc.Close()
	for _, s := range [][]byte{seed, layer, gz.Bytes(), zs.Bytes(), nil, seed[:700]} {
		f.Add(s, false)
		f.Add(s, true)
	}
	base := makeTar(f, file("a", "1"), file("d/b", "2"), file("d/e/f", "3"))

	f.Fuzz(func(t *testing.T, data []byte, asLayer bool) {
		ctx := context.Background()
		st := &cappedStore{Store: newStore()}
		opts := Options{Workers: 2}
		check := func(err error) {
			if err != nil && !errors.Is(err, cas.ErrInvalidArgument) && !errors.Is(err, cas.ErrUnsupported) &&
				!errors.Is(err, errTooBig) {
				t.Fatalf("unclassified error: %v", err)
			}
		}
		if !asLayer {
			res, err := Tar(ctx, st, bytes.NewReader(data), opts)
			check(err)
			if err == nil {
				// Whatever was accepted reads back as valid trees.
				flatten(t, st, res.Root)
			}
			return
		}
		b := cas.NewBuilder(st, cas.ZeroID)
		if _, err := ApplyTar(ctx, st, b, bytes.NewReader(base), true, Options{}); err != nil {
			t.Fatal(err)
		}
		_, err := ApplyTar(ctx, st, b, bytes.NewReader(data), true, opts)
		check(err)
		if err == nil {
			id, err := b.Write(ctx, st)
			if err != nil {
				t.Fatalf("write after a successful apply: %v", err)
			}
			flatten(t, st, id)
		}
	})
}

var errTooBig = errors.New("object over the fuzz cap")

// cappedStore refuses objects over 4 MiB: a few bytes of sparse tar header
// can describe gigabytes of zeros, legitimately, which a fuzzer finds fast.
type cappedStore struct{ *mem.Store }

func (c *cappedStore) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	const max = 4 << 20
	lr := &io.LimitedReader{R: r, N: max + 1}
	info, created, err := c.Store.Put(ctx, lr)
	if err == nil && lr.N == 0 {
		return cas.Info{}, false, errTooBig
	}
	return info, created, err
}
