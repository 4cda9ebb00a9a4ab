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

// Op names a store operation for SetFault.
type Op string

// The operations SetFault can fail.
const (
	OpGet    Op = "get"
	OpPut    Op = "put"
	OpHas    Op = "has"
	OpStat   Op = "stat"
	OpWalk   Op = "walk"
	OpDelete Op = "delete"
)

// Stats counts calls since New or ResetStats.
type Stats struct {
	Get, Put, Has, Stat, Walk, Delete int
	// Created counts Puts that stored a new object; BytesPut the bytes they
	// stored.
	Created  int
	BytesPut int64
}

// Store is an in-memory cas.Store.
type Store struct {
	mu    sync.Mutex
	objs  map[cas.ID][]byte
	stats Stats
	gets  map[cas.ID]int
	fault func(Op, cas.ID) error
}

var _ cas.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	return &Store{objs: map[cas.ID][]byte{}, gets: map[cas.ID]int{}}
}

// SetFault installs f, consulted by every operation with its id (ZeroID for
// Walk; for Put the id of the bytes read, once they are read). A non-nil
// result fails the operation with that error, wrapped. nil removes the hook.
// f runs without the store's lock held, possibly on many goroutines.
// Calls are still counted.
func (s *Store) SetFault(f func(op Op, id cas.ID) error) {
	s.mu.Lock()
	s.fault = f
	s.mu.Unlock()
}

// Stats returns the call counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Gets returns how many times Get was called for id.
func (s *Store) Gets(id cas.ID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets[id]
}

// ResetStats zeroes Stats and Gets.
func (s *Store) ResetStats() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats = Stats{}
	s.gets = map[cas.ID]int{}
}

// Len returns the number of stored objects.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.objs)
}

// Corrupt flips the last byte of object id (an empty object gains a byte),
// so that its content no longer matches its id. Missing is cas.ErrNotFound.
func (s *Store) Corrupt(id cas.ID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objs[id]
	if !ok {
		return fmt.Errorf("corrupt %s: %w", id, cas.ErrNotFound)
	}
	// A copy: readers in flight keep the bytes they started with.
	b = bytes.Clone(b)
	if len(b) == 0 {
		b = []byte{0}
	} else {
		b[len(b)-1] ^= 0xff
	}
	s.objs[id] = b
	return nil
}

// enter counts a call of op and runs the fault hook, outside the lock so
// the hook may call the store.
func (s *Store) enter(ctx context.Context, op Op, id cas.ID) error {
	s.mu.Lock()
	switch op {
	case OpGet:
		s.stats.Get++
		s.gets[id]++
	case OpPut:
		s.stats.Put++
	case OpHas:
		s.stats.Has++
	case OpStat:
		s.stats.Stat++
	case OpWalk:
		s.stats.Walk++
	case OpDelete:
		s.stats.Delete++
	}
	fault := s.fault
	s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s %s: %w", op, id, err)
	}
	return s.inject(fault, op, id)
}

func (s *Store) inject(fault func(Op, cas.ID) error, op Op, id cas.ID) error {
	if fault == nil {
		return nil
	}
	if err := fault(op, id); err != nil {
		return fmt.Errorf("%s %s: injected fault: %w", op, id, err)
	}
	return nil
}

// Get implements cas.Getter.
func (s *Store) Get(ctx context.Context, id cas.ID) (io.ReadCloser, error) {
	if err := s.enter(ctx, OpGet, id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	b, ok := s.objs[id]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("get %s: %w", id, cas.ErrNotFound)
	}
	return cas.VerifyingReader(id, io.NopCloser(bytes.NewReader(b))), nil
}

// chunk bounds how much Put reads between checks of its context.
const chunk = 64 << 10

// Put implements cas.Putter.
func (s *Store) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	s.mu.Lock()
	s.stats.Put++
	fault := s.fault
	s.mu.Unlock()
	var buf bytes.Buffer
	for {
		if err := ctx.Err(); err != nil {
			return cas.Info{}, false, fmt.Errorf("put: %w", err)
		}
		n, err := buf.ReadFrom(io.LimitReader(r, chunk))
		if err != nil {
			return cas.Info{}, false, fmt.Errorf("put: %w", err)
		}
		if n < chunk {
			break // the limit was not reached, so r is at EOF
		}
	}
	b := slices.Clip(buf.Bytes())
	info := cas.Info{ID: cas.Sum(b), Size: int64(len(b))}
	if err := s.inject(fault, OpPut, info.ID); err != nil {
		return cas.Info{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.objs[info.ID]; ok {
		return info, false, nil
	}
	s.objs[info.ID] = b
	s.stats.Created++
	s.stats.BytesPut += info.Size
	return info, true, nil
}

// Has implements cas.Haser.
func (s *Store) Has(ctx context.Context, id cas.ID) (bool, error) {
	if err := s.enter(ctx, OpHas, id); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.objs[id]
	return ok, nil
}

// Stat implements cas.Statter.
func (s *Store) Stat(ctx context.Context, id cas.ID) (cas.Info, error) {
	if err := s.enter(ctx, OpStat, id); err != nil {
		return cas.Info{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objs[id]
	if !ok {
		return cas.Info{}, fmt.Errorf("stat %s: %w", id, cas.ErrNotFound)
	}
	return cas.Info{ID: id, Size: int64(len(b))}, nil
}

// Walk implements cas.Walker, in id order (deterministic for tests), over a
// snapshot taken when it starts.
func (s *Store) Walk(ctx context.Context, fn func(cas.Info) error) error {
	if err := s.enter(ctx, OpWalk, cas.ZeroID); err != nil {
		return err
	}
	s.mu.Lock()
	infos := make([]cas.Info, 0, len(s.objs))
	for id, b := range s.objs {
		infos = append(infos, cas.Info{ID: id, Size: int64(len(b))})
	}
	s.mu.Unlock()
	slices.SortFunc(infos, func(a, b cas.Info) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	for _, info := range infos {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("walk: %w", err)
		}
		if err := fn(info); err != nil {
			return err
		}
	}
	return nil
}

// Delete implements cas.Deleter.
func (s *Store) Delete(ctx context.Context, id cas.ID) error {
	if err := s.enter(ctx, OpDelete, id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, id)
	return nil
}
