package cas_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/mem"
)

// putterOnly hides every role of the store but Put.
type putterOnly struct{ cas.Putter }

func TestNewBatchUsesTheStoresBatch(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	b := cas.NewBatch(s)
	defer b.Abort()
	info, created, err := b.Put(ctx, strings.NewReader("held"))
	if err != nil || !created {
		t.Fatalf("put: created %v, %v", created, err)
	}
	// Only the store's own batch can hold an object back.
	if ok, _ := s.Has(ctx, info.ID); ok {
		t.Fatal("NewBatch of a Batcher returned a forwarding batch: object visible before Commit")
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Has(ctx, info.ID); !ok {
		t.Fatal("object missing after Commit")
	}
}

func TestNewBatchFallsBackToPut(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	b := cas.NewBatch(putterOnly{s})
	defer b.Abort()
	info, created, err := b.Put(ctx, strings.NewReader("now"))
	if err != nil || !created || info.ID != cas.Sum([]byte("now")) {
		t.Fatalf("put = %+v created %v, %v", info, created, err)
	}
	if ok, _ := s.Has(ctx, info.ID); !ok {
		t.Fatal("forwarding batch: object not stored by Put")
	}
	if _, created, err := b.Put(ctx, strings.NewReader("now")); err != nil || created {
		t.Fatalf("second put of the same bytes: created %v, %v", created, err)
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Put(ctx, strings.NewReader("late")); !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("put after commit: err = %v, want ErrFailedPrecondition", err)
	}
	if err := b.Commit(ctx); !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("second commit: err = %v, want ErrFailedPrecondition", err)
	}
	b.Abort() // no-op
	if s.Len() != 1 {
		t.Fatalf("store holds %d objects, want 1", s.Len())
	}

	// A cancelled Commit is not reported as committed, and ends the batch.
	b = cas.NewBatch(putterOnly{s})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Commit(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("commit with a cancelled context: err = %v", err)
	}
	if _, _, err := b.Put(ctx, strings.NewReader("x")); !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("put after a failed commit: err = %v", err)
	}
	b = cas.NewBatch(putterOnly{s})
	b.Abort()
	if _, _, err := b.Put(ctx, strings.NewReader("x")); !errors.Is(err, cas.ErrFailedPrecondition) {
		t.Fatalf("put after abort: err = %v", err)
	}
}
