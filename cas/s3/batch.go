package s3

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/esf-dev/esf/cas"
)

// NewBatch implements cas.Batcher. A batch spools its objects to one temp
// file and sends nothing before Commit, which uploads them like Upload
// (small ones in packs, the rest loose), so nothing is visible before it.
func (s *Store) NewBatch() cas.Batch { return &batch{s: s, objs: map[cas.ID]*bentry{}} }

type batch struct {
	s    *Store
	mu   sync.Mutex
	done bool
	f    *os.File
	end  int64 // next free offset in f
	objs map[cas.ID]*bentry
}

type bentry struct {
	off, size int64
	stored    bool // already in the store when put: not uploaded
	ready     bool // bytes written to f (or stored)
}

func (b *batch) Put(ctx context.Context, r io.Reader) (cas.Info, bool, error) {
	if b.ended() {
		return cas.Info{}, false, fmt.Errorf("batch put: batch already ended: %w", cas.ErrFailedPrecondition)
	}
	sp, err := spool(ctx, r, b.s.tmp)
	if err != nil {
		return cas.Info{}, false, err
	}
	defer sp.Close()
	info := sp.info()
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return cas.Info{}, false, fmt.Errorf("batch put: batch already ended: %w", cas.ErrFailedPrecondition)
	}
	if _, dup := b.objs[sp.id]; dup {
		b.mu.Unlock()
		return info, false, nil
	}
	if b.f == nil {
		f, err := os.CreateTemp(b.s.tmp, "esf-s3-batch-*")
		if err != nil {
			b.mu.Unlock()
			return cas.Info{}, false, fmt.Errorf("batch put: %w", err)
		}
		b.f = f
	}
	e := &bentry{off: b.end, size: sp.size}
	b.end += sp.size
	b.objs[sp.id] = e
	f := b.f
	b.mu.Unlock()

	fail := func(err error) (cas.Info, bool, error) {
		b.mu.Lock()
		delete(b.objs, sp.id)
		b.mu.Unlock()
		return cas.Info{}, false, err
	}
	stored, err := b.s.Has(ctx, sp.id)
	if err != nil {
		return fail(err)
	}
	if !stored {
		if _, err := io.Copy(io.NewOffsetWriter(f, e.off), sp.reader()); err != nil {
			return fail(fmt.Errorf("batch put: %w", err))
		}
	}
	b.mu.Lock()
	e.stored, e.ready = stored, true
	b.mu.Unlock()
	return info, !stored, nil
}

func (b *batch) ended() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.done
}

func (b *batch) Commit(ctx context.Context) error {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return fmt.Errorf("batch commit: batch already ended: %w", cas.ErrFailedPrecondition)
	}
	b.done = true
	f := b.f
	var srcs []Source
	for id, e := range b.objs {
		if e.stored || !e.ready {
			continue
		}
		srcs = append(srcs, Source{Info: cas.Info{ID: id, Size: e.size}, Open: func() (io.ReadSeekCloser, error) {
			return nopCloser{io.NewSectionReader(f, e.off, e.size)}, nil
		}})
	}
	b.mu.Unlock()
	defer b.cleanup()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("batch commit: %w", err)
	}
	if err := b.s.Upload(ctx, srcs); err != nil {
		return fmt.Errorf("batch commit: %w", err)
	}
	return nil
}

func (b *batch) Abort() {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return
	}
	b.done = true
	b.mu.Unlock()
	b.cleanup()
}

func (b *batch) cleanup() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.f != nil {
		name := b.f.Name()
		b.f.Close()
		os.Remove(name)
		b.f = nil
	}
	b.objs = nil
}

type nopCloser struct{ io.ReadSeeker }

func (nopCloser) Close() error { return nil }
