package tier_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/cas/tier"
	"github.com/esf-dev/esf/ingest"
)

func boundedTier(t *testing.T, e *env, size int64, pinned func(context.Context) ([]cas.ID, error)) *tier.Store {
	t.Helper()
	l, err := local.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := tier.New(tier.Options{Local: l, Remote: e.remote, CacheSize: size, Pinned: pinned})
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// Past --cache-size the least recently used objects leave the cache (down
// to 90% of the bound); they are still read, fetched again.
func TestCacheSizeEvictsLeastRecentlyUsed(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil, "")
	const obj, bound = 10 << 10, 100 << 10
	ts := boundedTier(t, e, bound, nil)
	var blobs [][]byte
	for i := range 20 {
		b := bytes.Repeat([]byte{byte(i)}, obj)
		blobs = append(blobs, b)
		if _, _, err := ts.Put(ctx, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		// Keep object 0 hot.
		if _, err := cas.ReadAll(ctx, ts, cas.Sum(blobs[0])); err != nil {
			t.Fatal(err)
		}
	}
	if used := ts.CacheUsed(); used > bound {
		t.Fatalf("cache holds %d bytes, bound %d", used, bound)
	}
	if n := localCount(t, ts); n > bound/obj {
		t.Fatalf("cache holds %d objects of %d bytes, bound %d", n, obj, bound)
	}
	if ok, _ := ts.Local().Has(ctx, cas.Sum(blobs[0])); !ok {
		t.Fatal("the most recently read object was evicted")
	}
	if ok, _ := ts.Local().Has(ctx, cas.Sum(blobs[1])); ok {
		t.Fatal("the least recently used object is still cached")
	}
	if ts.Stats().Evictions.Load() == 0 {
		t.Fatal("no eviction counted")
	}
	for i, b := range blobs {
		got, err := cas.ReadAll(ctx, ts, cas.Sum(b))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("read of object %d after eviction: %v", i, err)
		}
	}
}

// Objects reachable from pinned roots (live attempts) stay cached however
// cold; a cache that was full at start is counted (and trimmed).
func TestCachePinnedRootsStay(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil, "")
	var root cas.ID
	ts := boundedTier(t, e, 100<<10, func(context.Context) ([]cas.ID, error) { return []cas.ID{root}, nil })
	src := t.TempDir()
	for i := range 5 {
		os.MkdirAll(filepath.Join(src, "d"), 0o755)
		if err := os.WriteFile(filepath.Join(src, "d", fmt.Sprint(i)), bytes.Repeat([]byte{'p', byte(i)}, 5<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, err := ingest.Path(ctx, ts, src, ingest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	root = res.Root
	for i := range 30 {
		if _, _, err := ts.Put(ctx, bytes.NewReader(bytes.Repeat([]byte{'x', byte(i)}, 5<<10))); err != nil {
			t.Fatal(err)
		}
	}
	if ts.Stats().Evictions.Load() == 0 {
		t.Fatal("nothing was evicted")
	}
	pinned := []cas.ID{root}
	tr, err := cas.ReadTree(ctx, ts.Local(), root)
	if err != nil {
		t.Fatalf("the pinned root tree left the cache: %v", err)
	}
	sub, err := cas.ReadTree(ctx, ts.Local(), tr.Entries[0].ID)
	if err != nil {
		t.Fatalf("a pinned tree left the cache: %v", err)
	}
	for _, en := range sub.Entries {
		pinned = append(pinned, en.ID)
	}
	for _, id := range pinned {
		if ok, _ := ts.Local().Has(ctx, id); !ok {
			t.Fatalf("pinned object %s was evicted", id.Short())
		}
	}

	// A new tier on the same (over-full) cache counts it and trims it at
	// the next eviction.
	ts2, err := tier.New(tier.Options{Local: ts.Local(), Remote: e.remote, CacheSize: 20 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := ts2.Evict(ctx); err != nil {
		t.Fatal(err)
	}
	if used := ts2.CacheUsed(); used > 20<<10 {
		t.Fatalf("after eviction the cache holds %d bytes", used)
	}
}
