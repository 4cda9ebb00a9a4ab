package mem_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/castest"
	"github.com/esf-dev/esf/cas/mem"
)

func TestBatchConformance(t *testing.T) {
	castest.RunBatch(t, func(t *testing.T) cas.Store { return harness{mem.New()} })
}

// OpCommit fails a commit part-way, as a crash may: the objects before the
// failing one (in id order) are published, the rest are not.
func TestBatchPartialCommit(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	b := s.NewBatch()
	defer b.Abort()
	var ids []cas.ID
	for i := range 5 {
		info, _, err := b.Put(ctx, bytes.NewReader([]byte{byte(i)}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	slices.SortFunc(ids, func(a, b cas.ID) int { return bytes.Compare(a[:], b[:]) })
	eio := errors.New("injected EIO")
	s.SetFault(func(op mem.Op, id cas.ID) error {
		if op == mem.OpCommit && id == ids[3] {
			return eio
		}
		return nil
	})
	if err := b.Commit(ctx); !errors.Is(err, eio) {
		t.Fatalf("commit with a fault on the 4th object: err = %v", err)
	}
	for i, id := range ids {
		if ok, _ := s.Has(ctx, id); ok != (i < 3) {
			t.Fatalf("object %d of 5 (id order): stored %v, want %v", i, ok, i < 3)
		}
	}
	if st := s.Stats(); st.Put != 5 || st.Created != 3 || st.BytesPut != 3 {
		t.Fatalf("stats = %+v, want 5 puts, 3 created, 3 bytes", st)
	}
}
