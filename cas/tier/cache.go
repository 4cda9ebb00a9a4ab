package tier

import (
	"container/list"
	"context"
	"errors"
	"fmt"

	"github.com/esf-dev/esf/cas"
)

// The cache bound (Options.CacheSize): the tier keeps the local objects in
// least-recently-used order, by bytes. Reads, fetches and writes touch an
// object. When the cache grows past the bound, the writer or reader that
// grew it evicts least-recently-used objects down to 90% of it (so that
// eviction is not paid on every write), skipping:
//   - pinned objects: everything reachable in the cache from the roots
//     Options.Pinned returns (the base roots of live attempts, whose FUSE
//     lower layer opens blobs by their local path);
//   - objects not known to be in the remote after asking it: the cache may
//     hold the only copy (a seal that failed after its local commit).
// An eviction pass first walks the local store, so objects another process
// put there (the projection server's fetches) are counted too, as recently
// used.

// lruEntry is one cached object.
type lruEntry struct {
	id   cas.ID
	size int64
}

// cacheState is the LRU; t.mu guards it.
type cacheState struct {
	max   int64
	used  int64
	order *list.List // front: most recently used
	elems map[cas.ID]*list.Element
}

func newCache(max int64) *cacheState {
	return &cacheState{max: max, order: list.New(), elems: map[cas.ID]*list.Element{}}
}

// touch records a use of id (size bytes); t.mu is held. It reports whether
// the cache is over its bound.
func (c *cacheState) touch(id cas.ID, size int64, front bool) bool {
	if e, ok := c.elems[id]; ok {
		if front {
			c.order.MoveToFront(e)
		}
		return c.used > c.max
	}
	var e *list.Element
	if front {
		e = c.order.PushFront(lruEntry{id, size})
	} else {
		e = c.order.PushBack(lruEntry{id, size})
	}
	c.elems[id] = e
	c.used += size
	return c.used > c.max
}

func (c *cacheState) drop(id cas.ID) {
	if e, ok := c.elems[id]; ok {
		c.used -= e.Value.(lruEntry).size
		c.order.Remove(e)
		delete(c.elems, id)
	}
}

// touch records a use; past the bound, it evicts (one evictor at a time:
// others go on).
func (t *Store) touch(ctx context.Context, id cas.ID, size int64) {
	if t.cache == nil {
		return
	}
	t.mu.Lock()
	over := t.cache.touch(id, size, true)
	t.mu.Unlock()
	if over && t.evicting.TryLock() {
		defer t.evicting.Unlock()
		if err := t.evict(context.WithoutCancel(ctx)); err != nil {
			t.log.Warn("cache eviction", "err", err)
		}
	}
}

// Evict runs an eviction pass now (it also runs by itself when the cache
// outgrows its bound).
func (t *Store) Evict(ctx context.Context) error {
	if t.cache == nil {
		return nil
	}
	t.evicting.Lock()
	defer t.evicting.Unlock()
	return t.evict(ctx)
}

// CacheUsed is the bytes the cache holds by the tier's count.
func (t *Store) CacheUsed() int64 {
	if t.cache == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cache.used
}

// seedCache counts what the local store holds.
func (t *Store) seedCache(ctx context.Context, front bool) error {
	return t.local.Walk(ctx, func(info cas.Info) error {
		t.mu.Lock()
		if _, ok := t.cache.elems[info.ID]; !ok {
			t.cache.touch(info.ID, info.Size, front)
		}
		t.mu.Unlock()
		return nil
	})
}

func (t *Store) evict(ctx context.Context) error {
	if err := t.seedCache(ctx, true); err != nil {
		return fmt.Errorf("cache eviction: %w", err)
	}
	pinned, err := t.pinned(ctx)
	if err != nil {
		return fmt.Errorf("cache eviction: pinned roots: %w", err)
	}
	t.mu.Lock()
	target := t.cache.max / 10 * 9
	need := t.cache.used - target
	var cands []lruEntry
	for e := t.cache.order.Back(); e != nil && need > 0; e = e.Prev() {
		le := e.Value.(lruEntry)
		if pinned[le.id] {
			continue
		}
		cands = append(cands, le)
		need -= le.size
	}
	t.mu.Unlock()
	for _, le := range cands {
		if !t.isKnown(le.id) {
			ok, err := t.remote.Has(ctx, le.id)
			if err != nil {
				return fmt.Errorf("cache eviction: %w", err)
			}
			if !ok {
				continue // the only copy
			}
			t.markKnown(le.id)
		}
		if err := t.local.Delete(ctx, le.id); err != nil {
			return fmt.Errorf("cache eviction: %w", err)
		}
		t.mu.Lock()
		t.cache.drop(le.id)
		t.mu.Unlock()
		t.stats.Evictions.Add(1)
		t.stats.EvictedBytes.Add(le.size)
	}
	return nil
}

// pinned is every object reachable in the cache from Options.Pinned's
// roots (a tree not cached pins nothing below it: nothing under it can
// have been read through it).
func (t *Store) pinned(ctx context.Context) (map[cas.ID]bool, error) {
	if t.pinnedRoots == nil {
		return nil, nil
	}
	roots, err := t.pinnedRoots(ctx)
	if err != nil {
		return nil, err
	}
	set := map[cas.ID]bool{}
	stack := append([]cas.ID(nil), roots...)
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if set[id] || id.IsZero() {
			continue
		}
		set[id] = true
		tr, err := cas.ReadTreeView(ctx, t.local, id)
		if errors.Is(err, cas.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for i := range tr.Len() {
			e := tr.Entry(i)
			switch e.Type {
			case cas.TypeDir:
				stack = append(stack, e.ID)
			case cas.TypeFile:
				set[e.ID] = true
			}
		}
	}
	return set, nil
}
