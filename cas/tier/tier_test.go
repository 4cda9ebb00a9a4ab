package tier_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/cas/tier"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/s3test"
)

type env struct {
	srv    *s3test.Server
	bucket string
	remote *s3store.Store
}

func newEnv(t *testing.T, srv *s3test.Server, endpoint string) *env {
	t.Helper()
	if srv == nil {
		srv = s3test.Start(t)
	}
	e := &env{srv: srv, bucket: srv.Bucket(t)}
	e.remote = e.store(t, endpoint)
	return e
}

// store is another remote store on the same bucket, through endpoint
// (a proxy) if set.
func (e *env) store(t *testing.T, endpoint string) *s3store.Store {
	t.Helper()
	c := awss3.New(e.srv.Client().Options(), s3store.ClientOptions, func(o *awss3.Options) {
		if endpoint != "" {
			o.BaseEndpoint = &endpoint
		}
	})
	st, err := s3store.New(s3store.Options{Client: c, Bucket: e.bucket, Prefix: "cas", TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func newTier(t *testing.T, remote tier.Remote) *tier.Store {
	t.Helper()
	l, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := tier.New(tier.Options{Local: l, Remote: remote})
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func localCount(t *testing.T, ts *tier.Store) int {
	t.Helper()
	n := 0
	if err := ts.Local().Walk(context.Background(), func(cas.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// Writes go through to the remote before they return; a second tier with
// an empty cache (another worker, or a restore) reads them back, fetching
// each once and only what it reads.
func TestWriteThroughAndRestore(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil, "")
	a := newTier(t, e.remote)
	var blobs [][]byte
	b := a.NewBatch()
	for i := range 30 {
		blob := bytes.Repeat([]byte{byte(i), 1}, 50*(i+1))
		blobs = append(blobs, blob)
		if _, _, err := b.Put(ctx, bytes.NewReader(blob)); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte("big"), 300<<10)
	blobs = append(blobs, big)
	if _, _, err := b.Put(ctx, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Put(ctx, bytes.NewReader([]byte("plain"))); err != nil {
		t.Fatal(err)
	}
	blobs = append(blobs, []byte("plain"))
	for _, blob := range blobs {
		if ok, err := e.remote.Has(ctx, cas.Sum(blob)); !ok || err != nil {
			t.Fatalf("a written %d-byte object is not in the remote: %v", len(blob), err)
		}
	}
	if up := a.Stats().Uploads.Load(); up != int64(len(blobs)) {
		t.Fatalf("uploads = %d, want %d", up, len(blobs))
	}
	// Writing the same again costs nothing remote.
	puts := e.remote.Stats().Puts.Load()
	if _, _, err := a.Put(ctx, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	if got := e.remote.Stats().Puts.Load(); got != puts {
		t.Fatalf("re-put of a known object made %d remote PUTs", got-puts)
	}

	c := newTier(t, e.store(t, ""))
	for _, i := range []int{3, 30} {
		got, err := cas.ReadAll(ctx, c, cas.Sum(blobs[i]))
		if err != nil || !bytes.Equal(got, blobs[i]) {
			t.Fatalf("restore read of object %d: %v", i, err)
		}
	}
	if n := c.Stats().Fetches.Load(); n != 2 {
		t.Fatalf("fetches = %d, want the 2 objects read", n)
	}
	if n := localCount(t, c); n != 2 {
		t.Fatalf("cache holds %d objects, want the 2 read", n)
	}
	// Cached now: no second fetch.
	if _, err := cas.ReadAll(ctx, c, cas.Sum(blobs[3])); err != nil {
		t.Fatal(err)
	}
	if n := c.Stats().Fetches.Load(); n != 2 {
		t.Fatalf("a cached object was fetched again (%d fetches)", n)
	}
	if ok, err := c.Has(ctx, cas.Sum(blobs[5])); !ok || err != nil {
		t.Fatalf("has of a remote-only object = %v, %v", ok, err)
	}
	if _, err := c.Get(ctx, cas.Sum([]byte("nowhere"))); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("get of an object nowhere: %v", err)
	}
}

// A remote object whose bytes do not match is refetched once, then
// reported corrupt; nothing of it is stored in the cache.
func TestCorruptRemoteIsNeverCached(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil, "")
	blob := bytes.Repeat([]byte("x"), 1000)
	info, _, err := e.remote.Put(ctx, bytes.NewReader(blob))
	if err != nil {
		t.Fatal(err)
	}
	p := e.srv.Path(e.bucket, e.remote.Prefix()+"o/"+info.ID.String())
	bad := bytes.Clone(blob)
	bad[500] = 'y'
	if err := os.WriteFile(p, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	c := newTier(t, e.remote)
	rc, err := c.Get(ctx, info.ID)
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("get of a corrupt remote object: %v, want ErrCorrupt", err)
	}
	if n := c.Stats().FetchRetries.Load(); n != 1 {
		t.Fatalf("fetch retries = %d, want 1", n)
	}
	if n := localCount(t, c); n != 0 {
		t.Fatalf("cache holds %d objects after a corrupt fetch", n)
	}
	// Repaired remotely: the next read succeeds.
	if err := os.WriteFile(p, blob, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := cas.ReadAll(ctx, c, info.ID); err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("read after repair: %v", err)
	}
}

// With the remote down, a write fails unavailable (sync durability); the
// object stays in the cache, and the next write of it once the remote is
// back makes it durable.
func TestRemoteDownFailsWrites(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil, "")
	a := newTier(t, e.remote)
	e.srv.Kill()
	blob := []byte("while down")
	_, _, err := a.Put(ctx, bytes.NewReader(blob))
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("put with the remote down: %v, want ErrUnavailable", err)
	}
	if err := e.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Put(ctx, bytes.NewReader(blob)); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.remote.Has(ctx, cas.Sum(blob)); !ok || err != nil {
		t.Fatalf("after the remote is back, a re-put left the object only local: %v", err)
	}
}
