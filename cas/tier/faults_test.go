package tier_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/tier"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/s3test"
)

// perKey applies fault to the first n requests of each object key that
// match method (others pass).
func perKey(method string, n int, fault s3test.Fault) func(*http.Request) s3test.Fault {
	var mu sync.Mutex
	seen := map[string]int{}
	return func(r *http.Request) s3test.Fault {
		if r.Method != method || (!strings.Contains(r.URL.Path, "/o/") && !strings.Contains(r.URL.Path, "/p/")) {
			return s3test.Fault{}
		}
		mu.Lock()
		defer mu.Unlock()
		seen[r.URL.Path]++
		if seen[r.URL.Path] <= n {
			return fault
		}
		return s3test.Fault{}
	}
}

func always(method string, fault s3test.Fault) func(*http.Request) s3test.Fault {
	return perKey(method, 1<<30, fault)
}

// faultEnv is a remote written directly and a reading tier behind the
// fault proxy.
func faultEnv(t *testing.T) (*env, *s3test.Proxy, *tier.Store) {
	srv := s3test.Start(t)
	e := newEnv(t, srv, "")
	p := s3test.StartProxy(t, srv)
	return e, p, newTier(t, e.store(t, p.Endpoint))
}

func seed(t *testing.T, e *env) ([][]byte, []cas.ID) {
	t.Helper()
	ctx := context.Background()
	w := newTier(t, e.remote)
	b := w.NewBatch()
	var blobs [][]byte
	var ids []cas.ID
	for i := range 6 {
		blob := bytes.Repeat([]byte{byte('a' + i)}, 3000*(i+1))
		blobs, ids = append(blobs, blob), append(ids, cas.Sum(blob))
		if _, _, err := b.Put(ctx, bytes.NewReader(blob)); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte("large object "), 100<<10) // loose
	blobs, ids = append(blobs, big), append(ids, cas.Sum(big))
	if _, _, err := b.Put(ctx, bytes.NewReader(big)); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return blobs, ids
}

func readAll(t *testing.T, ts *tier.Store, blobs [][]byte, ids []cas.ID) {
	t.Helper()
	for i, id := range ids {
		got, err := cas.ReadAll(context.Background(), ts, id)
		if err != nil {
			t.Fatalf("read object %d through faults: %v", i, err)
		}
		if !bytes.Equal(got, blobs[i]) {
			t.Fatalf("object %d differs", i)
		}
	}
}

// Transient faults (5xx, resets, truncated, bit-flipped and slow bodies)
// on the first transfer of every object: every read succeeds with the
// right bytes, and the faults were really injected.
func TestTransientFaultsAreRetried(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault s3test.Fault
	}{
		{"503", s3test.Fault{Kind: s3test.Status, Status: 503}},
		{"500", s3test.Fault{Kind: s3test.Status, Status: 500}},
		{"Reset", s3test.Fault{Kind: s3test.Reset}},
		{"Truncate", s3test.Fault{Kind: s3test.Truncate}},
		{"Flip", s3test.Fault{Kind: s3test.Flip}},
		{"Slow", s3test.Fault{Kind: s3test.Slow, Delay: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, p, ts := faultEnv(t)
			blobs, ids := seed(t, e)
			p.Set(perKey(http.MethodGet, 1, tc.fault))
			readAll(t, ts, blobs, ids)
			if p.Count(tc.fault.Kind) == 0 {
				t.Fatal("no fault was injected")
			}
		})
	}
}

// A remote that always flips bits in objects: nothing corrupt is served
// or stored, and each object was fetched twice before giving up. With the
// pack indexes flipped too, the indexes fail to load: still nothing served.
func TestBitFlipsNeverServedOrStored(t *testing.T) {
	e, p, ts := faultEnv(t)
	_, ids := seed(t, e)
	flip := always(http.MethodGet, s3test.Fault{Kind: s3test.Flip})
	p.Set(func(r *http.Request) s3test.Fault {
		if strings.HasSuffix(r.URL.Path, ".idx") {
			return s3test.Fault{}
		}
		return flip(r)
	})
	for _, id := range ids {
		if _, err := cas.ReadAll(context.Background(), ts, id); !errors.Is(err, cas.ErrCorrupt) {
			t.Fatalf("read through a bit-flipping remote: %v, want ErrCorrupt", err)
		}
	}
	if n := localCount(t, ts); n != 0 {
		t.Fatalf("the cache stored %d objects from a bit-flipping remote", n)
	}
	if n := ts.Stats().Corrupt.Load(); n != int64(len(ids)) {
		t.Fatalf("corrupt fetches = %d, want %d", n, len(ids))
	}

	e, p, ts = faultEnv(t)
	_, ids = seed(t, e)
	p.Set(flip)
	for _, id := range ids {
		if _, err := cas.ReadAll(context.Background(), ts, id); !errors.Is(err, cas.ErrCorrupt) {
			t.Fatalf("read with bit-flipped indexes: %v, want ErrCorrupt", err)
		}
	}
	if n := localCount(t, ts); n != 0 {
		t.Fatalf("the cache stored %d objects with bit-flipped indexes", n)
	}
}

// Uploads through 5xx and resets (before the response and mid-body)
// succeed by retrying; a connection that always drops mid-upload fails
// the write unavailable and leaves no object, partial or whole.
func TestUploadFaults(t *testing.T) {
	ctx := context.Background()
	for _, fault := range []s3test.Fault{{Kind: s3test.Status, Status: 503}, {Kind: s3test.Reset}, {Kind: s3test.ResetUpload}} {
		e, p, _ := faultEnv(t)
		w := newTier(t, e.store(t, p.Endpoint))
		p.Set(perKey(http.MethodPut, 2, fault))
		blob := bytes.Repeat([]byte("upload "), 50<<10)
		if _, _, err := w.Put(ctx, bytes.NewReader(blob)); err != nil {
			t.Fatalf("put through fault %v: %v", fault.Kind, err)
		}
		if got, err := cas.ReadAll(ctx, e.remote, cas.Sum(blob)); err != nil || !bytes.Equal(got, blob) {
			t.Fatalf("object put through fault %v: %v", fault.Kind, err)
		}
	}
	e, p, _ := faultEnv(t)
	w := newTier(t, e.store(t, p.Endpoint))
	p.Set(always(http.MethodPut, s3test.Fault{Kind: s3test.ResetUpload}))
	blob := bytes.Repeat([]byte("never whole "), 50<<10)
	if _, _, err := w.Put(ctx, bytes.NewReader(blob)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("put through a connection that always drops: %v, want ErrUnavailable", err)
	}
	if ok, err := e.remote.Has(ctx, cas.Sum(blob)); ok || err != nil {
		t.Fatalf("a dropped upload left an object: %v, %v", ok, err)
	}
	var keys []string
	if err := e.remote.Walk(ctx, func(info cas.Info) error { keys = append(keys, info.ID.Short()); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Fatalf("a dropped upload left objects %v", keys)
	}
}
