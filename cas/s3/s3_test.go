package s3_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/castest"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/internal/s3test"
)

// harness gives the suite a way to damage objects (in the server's posix
// backend, as a bad disk would) and to see leftovers: spool files in the
// store's temp dir, and packs without an index.
type harness struct {
	*s3store.Store
	srv    *s3test.Server
	bucket string
	tmp    string
}

func (h harness) Corrupt(t testing.TB, id cas.ID) {
	t.Helper()
	p := h.srv.Path(h.bucket, h.Prefix()+"o/"+id.String())
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("corrupt %s: only loose objects can be damaged here: %v", id.Short(), err)
	}
	b[len(b)-1] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (h harness) TempFiles(t testing.TB) []string {
	t.Helper()
	ents, err := os.ReadDir(h.tmp)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, filepath.Join(h.tmp, e.Name()))
	}
	orphans, err := h.Orphans(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return append(out, orphans...)
}

func client(srv *s3test.Server) *awss3.Client {
	return awss3.New(srv.Client().Options(), s3store.ClientOptions)
}

func newStore(t *testing.T, srv *s3test.Server, o s3store.Options) harness {
	t.Helper()
	bucket := srv.Bucket(t)
	o.Client, o.Bucket, o.Prefix = client(srv), bucket, "esf/t"
	if o.TempDir == "" {
		o.TempDir = t.TempDir()
	}
	st, err := s3store.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return harness{Store: st, srv: srv, bucket: bucket, tmp: o.TempDir}
}

func TestConformance(t *testing.T) {
	srv := s3test.Start(t)
	castest.Run(t, func(t *testing.T) cas.Store { return newStore(t, srv, s3store.Options{}) })
}

func TestBatchConformance(t *testing.T) {
	srv := s3test.Start(t)
	castest.RunBatch(t, func(t *testing.T) cas.Store { return newStore(t, srv, s3store.Options{}) })
}

// Small packs, so that the suite's batches spread over many packs and
// deletes repack packs that hold other objects.
func TestBatchConformanceSmallPacks(t *testing.T) {
	srv := s3test.Start(t)
	castest.RunBatch(t, func(t *testing.T) cas.Store {
		return newStore(t, srv, s3store.Options{PackSize: 4 << 10})
	})
}

// Small objects of a batch land in packs, and another Store on the same
// bucket (another worker) finds them through the indexes; deleting one
// repacks its pack and keeps the rest.
func TestPacksSharedAndRepacked(t *testing.T) {
	ctx := context.Background()
	srv := s3test.Start(t)
	a := newStore(t, srv, s3store.Options{})
	b := cas.NewBatch(a)
	var ids []cas.ID
	var blobs [][]byte
	for i := range 50 {
		blob := bytes.Repeat([]byte{byte(i)}, 100+i)
		info, _, err := b.Put(ctx, bytes.NewReader(blob))
		if err != nil {
			t.Fatal(err)
		}
		ids, blobs = append(ids, info.ID), append(blobs, blob)
	}
	big := bytes.Repeat([]byte("L"), s3store.DefaultPackThreshold)
	bigInfo, _, err := b.Put(ctx, bytes.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	puts := a.Stats().Puts.Load()
	if puts != 3 { // one pack, its index, one loose object
		t.Fatalf("a batch of 50 small objects and a large one took %d PUTs, want 3", puts)
	}
	if _, err := os.Stat(a.srv.Path(a.bucket, a.Prefix()+"o/"+bigInfo.ID.String())); err != nil {
		t.Fatalf("the large object is not loose: %v", err)
	}

	other, err := s3store.New(s3store.Options{Client: client(srv), Bucket: a.bucket, Prefix: "esf/t", TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		got, err := cas.ReadAll(ctx, other, id)
		if err != nil || !bytes.Equal(got, blobs[i]) {
			t.Fatalf("other store reads packed object %d: %v", i, err)
		}
	}
	if err := other.Delete(ctx, ids[7]); err != nil {
		t.Fatal(err)
	}
	if ok, err := other.Has(ctx, ids[7]); ok || err != nil {
		t.Fatalf("has deleted packed object = %v, %v", ok, err)
	}
	// The first store's index is stale: its read of a moved object finds
	// the new pack by reloading.
	for i, id := range ids {
		if i == 7 {
			if _, err := a.Get(ctx, id); !errors.Is(err, cas.ErrNotFound) {
				t.Fatalf("get of the deleted object through the stale store: %v", err)
			}
			continue
		}
		rc, err := a.Get(ctx, id)
		if err != nil {
			t.Fatalf("get %d after repack: %v", i, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, blobs[i]) {
			t.Fatalf("read %d after repack: %v", i, err)
		}
	}
	if o, err := a.Orphans(ctx); err != nil || len(o) != 0 {
		t.Fatalf("orphans after repack = %q, %v", o, err)
	}
}
