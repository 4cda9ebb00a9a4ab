package ingest

import (
	"context"
	"sync"

	"github.com/esf-dev/esf/cas"
)

// sink stores small blobs on a bounded pool of goroutines while the tar
// reader goes on: the reader hashes each small member itself (so it can
// stage the entry in order at once) and hands the bytes over, and the
// store's latency (an fsync per new object on disk) overlaps with reading.
// At most 2*workers blobs are in flight, which bounds memory.
type sink struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	obj    *objects
	jobs   chan sinkBlob
	wg     sync.WaitGroup
}

type sinkBlob struct {
	data []byte
	id   cas.ID
}

func newSink(ctx context.Context, obj *objects, workers int) *sink {
	ctx, cancel := context.WithCancelCause(ctx)
	s := &sink{ctx: ctx, cancel: cancel, obj: obj, jobs: make(chan sinkBlob, workers)}
	for range workers {
		s.wg.Go(s.work)
	}
	return s
}

func (s *sink) work() {
	for b := range s.jobs {
		if s.ctx.Err() != nil {
			continue // abandoned: drain so submit never blocks forever
		}
		if _, _, err := s.obj.putBytes(s.ctx, b.data, b.id); err != nil {
			s.cancel(err)
		}
	}
}

// submit queues data, whose id is id, for storing. It fails once the sink
// has failed or its context is done.
func (s *sink) submit(data []byte, id cas.ID) error {
	select {
	case s.jobs <- sinkBlob{data: data, id: id}:
		return nil
	case <-s.ctx.Done():
		return context.Cause(s.ctx)
	}
}

// close waits until every submitted blob is stored or abandoned and
// returns the first failure. A non-nil err abandons what is queued and is
// returned as is. close must be called exactly once.
func (s *sink) close(err error) error {
	if err != nil {
		s.cancel(err)
	}
	close(s.jobs)
	s.wg.Wait()
	cause := context.Cause(s.ctx)
	s.cancel(nil)
	if err != nil {
		return err
	}
	return cause
}
