package mem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/internal/kvutil"
)

// Options configure a Store; the zero value is valid.
type Options struct {
	// Now is the clock behind Reader.Now; default time.Now.
	Now func() time.Time
	// Failpoint is evaluated like the pebble store's; default none.
	Failpoint func(name string) error
}

// Store is the in-memory journal.Store.
type Store struct {
	opts   Options
	notify kvutil.Broadcaster
	writer chan struct{}

	mu     sync.RWMutex // guards the fields below; held shared by View
	keys   []string     // sorted
	vals   map[string][]byte
	closed bool
}

var _ journal.Store = (*Store)(nil)

// New returns an empty store.
func New(opts Options) *Store {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Failpoint == nil {
		opts.Failpoint = func(string) error { return nil }
	}
	s := &Store{opts: opts, writer: make(chan struct{}, 1), vals: map[string][]byte{}}
	s.apply(map[string][]byte{string(kvutil.SchemaKey): kvutil.SchemaValue()})
	return s
}

// View implements journal.Store.
func (s *Store) View(ctx context.Context, fn func(r journal.Reader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return journal.ErrClosed
	}
	r := &reader{ctx: ctx, s: s, now: s.opts.Now().UTC()}
	defer func() { r.ended = true }()
	return fn(r)
}

// Update implements journal.Store.
func (s *Store) Update(ctx context.Context, fn func(tx journal.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case s.writer <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.writer }()
	if s.isClosed() {
		return journal.ErrClosed
	}
	if err := s.opts.Failpoint(journal.FailpointUpdateBegin); err != nil {
		return err
	}
	// Only this goroutine changes the data while it holds the writer lock,
	// so the transaction reads it without the RWMutex; Views hold it shared.
	t := &tx{reader: reader{ctx: ctx, s: s, now: s.opts.Now().UTC()}, writes: kvutil.Writes{}}
	t.reader.tx = t
	err := fn(t)
	t.ended = true
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(t.writes) == 0 {
		return nil
	}
	if err := s.opts.Failpoint(journal.FailpointUpdateBeforeCommit); err != nil {
		return err
	}
	s.mu.Lock()
	s.apply(t.writes)
	s.mu.Unlock()
	if t.appends.Appended() {
		s.notify.Broadcast()
	}
	return s.opts.Failpoint(journal.FailpointUpdateAfterCommit)
}

func (s *Store) isClosed() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.closed
}

// apply writes a batch (nil value: delete). Caller holds mu.
func (s *Store) apply(writes kvutil.Writes) {
	for k, v := range writes {
		i, found := slices.BinarySearch(s.keys, k)
		switch {
		case v == nil && found:
			s.keys = slices.Delete(s.keys, i, i+1)
			delete(s.vals, k)
		case v != nil && !found:
			s.keys = slices.Insert(s.keys, i, k)
			fallthrough
		case v != nil:
			s.vals[k] = v
		}
	}
}

// Notify implements journal.Store.
func (s *Store) Notify() <-chan struct{} { return s.notify.Wait() }

// Close implements journal.Store.
func (s *Store) Close() error {
	s.writer <- struct{}{}
	defer func() { <-s.writer }()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.notify.Close()
	}
	return nil
}

type reader struct {
	ctx   context.Context
	s     *Store
	tx    *tx // nil in a View
	now   time.Time
	ended bool
}

var errEnded = fmt.Errorf("journal transaction used after it ended: %w", journal.ErrFailedPrecondition)

func (r *reader) Get(key []byte) ([]byte, error) {
	if r.ended {
		return nil, errEnded
	}
	if r.tx != nil {
		if v, ok := r.tx.writes[string(key)]; ok {
			if v == nil {
				return nil, fmt.Errorf("key %q: %w", key, journal.ErrNotFound)
			}
			return bytes.Clone(v), nil
		}
	}
	v, ok := r.s.vals[string(key)]
	if !ok {
		return nil, fmt.Errorf("key %q: %w", key, journal.ErrNotFound)
	}
	return bytes.Clone(v), nil
}

type kv struct {
	k string
	v []byte
}

func (r *reader) Scan(start, end []byte, fn func(key, value []byte) error) error {
	if r.ended {
		return errEnded
	}
	if err := r.ctx.Err(); err != nil {
		return err
	}
	inRange := func(k string) bool {
		return k >= string(start) && (end == nil || k < string(end))
	}
	// The overlay as of now, sorted: later writes in fn are not seen.
	var overlay []kv
	if r.tx != nil {
		for k, v := range r.tx.writes {
			if inRange(k) {
				overlay = append(overlay, kv{k, v})
			}
		}
		sort.Slice(overlay, func(i, j int) bool { return overlay[i].k < overlay[j].k })
	}
	// The base range does not move during the scan: in a View no commit can
	// run (we hold mu shared), and in an Update fn's writes go to the overlay.
	lo, _ := slices.BinarySearch(r.s.keys, string(start))
	hi := len(r.s.keys)
	if end != nil {
		hi, _ = slices.BinarySearch(r.s.keys, string(end))
	}
	base := r.s.keys[lo:max(lo, hi)]

	n := 0
	emit := func(k string, v []byte) error {
		if n++; n%64 == 0 {
			if err := r.ctx.Err(); err != nil {
				return err
			}
		}
		return fn([]byte(k), bytes.Clone(v))
	}
	i, j := 0, 0
	var err error
	for err == nil && (i < len(base) || j < len(overlay)) {
		switch {
		case j == len(overlay) || i < len(base) && base[i] < overlay[j].k:
			err = emit(base[i], r.s.vals[base[i]])
			i++
		default:
			if i < len(base) && base[i] == overlay[j].k {
				i++
			}
			if overlay[j].v != nil {
				err = emit(overlay[j].k, overlay[j].v)
			}
			j++
		}
	}
	if errors.Is(err, journal.ErrStop) {
		return nil
	}
	return err
}

func (r *reader) Events(after uint64, fn func(ev journal.Event) error) error {
	return kvutil.ScanEvents(r.Scan, after, fn)
}

func (r *reader) LastSeq() (uint64, error) {
	if r.ended {
		return 0, errEnded
	}
	return kvutil.LastSeq(r.Get)
}

func (r *reader) Now() time.Time { return r.now }

type tx struct {
	reader
	writes  kvutil.Writes // nil value: deleted
	appends kvutil.Appends
}

func (t *tx) Put(key, value []byte) error {
	if t.ended {
		return errEnded
	}
	return t.writes.Put(key, value)
}

// RawPut writes without the reserved-prefix check, for kvutil's event log.
func (t *tx) RawPut(key, value []byte) error {
	if t.ended {
		return errEnded
	}
	t.writes[string(key)] = append([]byte{}, value...) // non-nil: nil means deleted
	return nil
}

func (t *tx) Delete(key []byte) error {
	if t.ended {
		return errEnded
	}
	return t.writes.Delete(key)
}

func (t *tx) AppendEvent(ev journal.Event) error {
	if t.ended {
		return errEnded
	}
	return t.appends.Append(t, t.now, ev)
}

func (t *tx) Events(after uint64, fn func(ev journal.Event) error) error {
	return t.appends.Events(t.Scan, after, fn)
}

func (t *tx) LastSeq() (uint64, error) {
	if t.ended {
		return 0, errEnded
	}
	return t.appends.LastSeq(t.Get)
}
