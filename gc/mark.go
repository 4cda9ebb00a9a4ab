package gc

import (
	"context"
	"fmt"
	"sync"

	"github.com/esf-dev/esf/cas"
)

// Set is a set of ids, safe for concurrent use. Its Add and Has fit Mark's
// mark and Sweep's live.
type Set struct {
	mu sync.RWMutex
	m  map[cas.ID]struct{}
}

// NewSet returns an empty set.
func NewSet() *Set { return &Set{m: map[cas.ID]struct{}{}} }

// Add puts id in the set.
func (s *Set) Add(id cas.ID) {
	s.mu.Lock()
	s.m[id] = struct{}{}
	s.mu.Unlock()
}

// Has reports whether id is in the set.
func (s *Set) Has(id cas.ID) bool {
	s.mu.RLock()
	_, ok := s.m[id]
	s.mu.RUnlock()
	return ok
}

// Len returns the number of ids in the set.
func (s *Set) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.m)
}

// Mark calls mark for every object reachable from roots, and for every id
// in extra. A root is a tree: Mark reads it and every tree below it, each
// distinct tree once however many roots or directories share it, and marks
// trees and the blobs their file entries name without reading the blobs. An
// extra id is marked as it is, never read (evaluation evidence, provenance
// records: objects that are not trees). ZeroID roots are skipped.
//
// mark is called on the caller's goroutine, once per tree and at least once
// per blob (a blob shared by several trees may be reported again). A tree
// that cannot be read (missing, corrupt) stops the walk with its error:
// whatever it references would otherwise look unreachable, and a sweep must
// not run on a partial mark.
func Mark(ctx context.Context, g cas.Getter, roots []cas.ID, extra []cas.ID, mark func(cas.ID)) error {
	for _, id := range extra {
		mark(id)
	}
	seen := map[cas.ID]struct{}{}
	// An explicit stack: trees can be as deep as paths are long.
	var stack []cas.ID
	for _, root := range roots {
		if root.IsZero() {
			continue
		}
		if _, ok := seen[root]; ok {
			continue
		}
		seen[root] = struct{}{}
		stack = append(stack[:0], root)
		for len(stack) > 0 {
			id := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("mark: %w", err)
			}
			t, err := cas.ReadTreeView(ctx, g, id)
			if err != nil {
				return fmt.Errorf("mark from root %s: %w", root, err)
			}
			mark(id)
			for i := range t.Len() {
				e := t.Entry(i)
				switch e.Type {
				case cas.TypeDir:
					if _, ok := seen[e.ID]; !ok {
						seen[e.ID] = struct{}{}
						stack = append(stack, e.ID)
					}
				case cas.TypeFile:
					mark(e.ID)
				}
			}
		}
	}
	return nil
}
