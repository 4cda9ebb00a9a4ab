package mem

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/esf-dev/esf/cas"
)

// OpCommit names the publication of one object by a batch's Commit, for
// SetFault. The hook is consulted with each object's id, in id order, just
// before it is published; an error stops Commit there, leaving the objects
// before it published and dropping the rest, which is the worst case the
// cas.Batch contract allows after a crash. Consumers use it to test that
// they survive a partial commit.
const OpCommit Op = "commit"

var _ cas.Batcher = (*Store)(nil)

// NewBatch implements cas.Batcher. The batch holds its objects apart from
// the store until Commit. Stats count a batch's Puts as Puts when they are
// called, and its objects as Created (and BytesPut) when Commit publishes
// them.
func (s *Store) NewBatch() cas.Batch {
	return &batch{s: s, objs: map[cas.ID][]byte{}}
}

type batch struct {
	s     *Store
	mu    sync.Mutex
	ended bool
	objs  map[cas.ID][]byte
}

func errEnded(op string) error {
	return fmt.Errorf("batch %s: batch already ended: %w", op, cas.ErrFailedPrecondition)
}

func (b *batch) isEnded() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ended
}

// Put implements cas.Putter for the batch.
func (b *batch) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	if b.isEnded() {
		return cas.Info{}, false, errEnded("put")
	}
	s := b.s
	s.mu.Lock()
	s.stats.Put++
	fault := s.fault
	s.mu.Unlock()
	data, err := readChunked(ctx, r)
	if err != nil {
		return cas.Info{}, false, fmt.Errorf("batch put: %w", err)
	}
	info := cas.Info{ID: cas.Sum(data), Size: int64(len(data))}
	if err := s.inject(fault, OpPut, info.ID); err != nil {
		return cas.Info{}, false, err
	}
	s.mu.Lock()
	_, stored := s.objs[info.ID]
	s.mu.Unlock()

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return cas.Info{}, false, errEnded("put")
	}
	if _, in := b.objs[info.ID]; in || stored {
		return info, false, nil
	}
	b.objs[info.ID] = data
	return info, true, nil
}

// readChunked reads r to EOF, checking ctx between chunks as Store.Put does.
func readChunked(ctx context.Context, r io.Reader) ([]byte, error) {
	var buf bytes.Buffer
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := buf.ReadFrom(io.LimitReader(r, chunk))
		if err != nil {
			return nil, err
		}
		if n < chunk {
			return slices.Clip(buf.Bytes()), nil
		}
	}
}

func (b *batch) end() (map[cas.ID][]byte, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return nil, false
	}
	objs := b.objs
	b.ended, b.objs = true, nil
	return objs, true
}

// Abort implements cas.Batch.
func (b *batch) Abort() { b.end() }

// Commit implements cas.Batch: it publishes the objects one by one in id
// order, consulting the fault hook (OpCommit) before each.
func (b *batch) Commit(ctx context.Context) error {
	objs, ok := b.end()
	if !ok {
		return errEnded("commit")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("batch commit: %w", err)
	}
	ids := make([]cas.ID, 0, len(objs))
	for id := range objs {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b cas.ID) int { return bytes.Compare(a[:], b[:]) })
	s := b.s
	s.mu.Lock()
	fault := s.fault
	s.mu.Unlock()
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("batch commit: %w", err)
		}
		if err := s.inject(fault, OpCommit, id); err != nil {
			return fmt.Errorf("batch commit: %w", err)
		}
		s.mu.Lock()
		if _, ok := s.objs[id]; !ok {
			s.objs[id] = objs[id]
			s.stats.Created++
			s.stats.BytesPut += int64(len(objs[id]))
		}
		s.mu.Unlock()
	}
	return nil
}
