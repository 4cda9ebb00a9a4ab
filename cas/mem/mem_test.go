package mem_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/castest"
	"github.com/esf-dev/esf/cas/mem"
)

// harness adapts mem.Store's Corrupt hook to the suite's Corrupter.
type harness struct{ *mem.Store }

func (h harness) Corrupt(t testing.TB, id cas.ID) {
	t.Helper()
	if err := h.Store.Corrupt(id); err != nil {
		t.Fatal(err)
	}
}

func TestConformance(t *testing.T) {
	castest.Run(t, func(t *testing.T) cas.Store { return harness{mem.New()} })
}

func TestStatsCountCalls(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	a, _, err := s.Put(ctx, bytes.NewReader([]byte("a")))
	if err != nil {
		t.Fatal(err)
	}
	if _, created, _ := s.Put(ctx, bytes.NewReader([]byte("a"))); created {
		t.Fatal("second put created")
	}
	if _, err := cas.ReadAll(ctx, s, a.ID); err != nil {
		t.Fatal(err)
	}
	s.Has(ctx, a.ID)
	s.Stat(ctx, a.ID)
	s.Walk(ctx, func(cas.Info) error { return nil })
	s.Delete(ctx, cas.ZeroID)
	want := mem.Stats{Get: 1, Put: 2, Has: 1, Stat: 1, Walk: 1, Delete: 1, Created: 1, BytesPut: 1}
	if got := s.Stats(); got != want {
		t.Fatalf("stats = %+v, want %+v", got, want)
	}
	if s.Gets(a.ID) != 1 || s.Gets(cas.ZeroID) != 0 {
		t.Fatalf("per-id gets = %d, %d", s.Gets(a.ID), s.Gets(cas.ZeroID))
	}
	s.ResetStats()
	if s.Stats() != (mem.Stats{}) || s.Gets(a.ID) != 0 || s.Len() != 1 {
		t.Fatalf("after reset: %+v gets %d len %d", s.Stats(), s.Gets(a.ID), s.Len())
	}
}

func TestFaultInjection(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	a, _, _ := s.Put(ctx, bytes.NewReader([]byte("a")))
	b, _, _ := s.Put(ctx, bytes.NewReader([]byte("b")))
	eio := errors.New("injected EIO")
	s.SetFault(func(op mem.Op, id cas.ID) error {
		// The hook may call the store (it runs unlocked), as long as it
		// does not recurse into itself.
		if op == mem.OpGet && id == a.ID {
			if ok, _ := s.Has(ctx, id); ok {
				return eio
			}
		}
		if op == mem.OpPut && id == cas.Sum([]byte("c")) {
			return eio
		}
		return nil
	})
	if _, err := s.Get(ctx, a.ID); !errors.Is(err, eio) {
		t.Fatalf("get with fault: err = %v", err)
	}
	if _, err := cas.ReadAll(ctx, s, b.ID); err != nil {
		t.Fatalf("get of an object without fault: %v", err)
	}
	if _, _, err := s.Put(ctx, bytes.NewReader([]byte("c"))); !errors.Is(err, eio) || s.Len() != 2 {
		t.Fatalf("put with fault: err = %v, len %d", err, s.Len())
	}
	s.SetFault(nil)
	if _, err := cas.ReadAll(ctx, s, a.ID); err != nil {
		t.Fatalf("get after clearing the fault: %v", err)
	}
}

func TestCorruptKeepsReadersInFlight(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	content := bytes.Repeat([]byte("x"), 1000)
	a, _, _ := s.Put(ctx, bytes.NewReader(content))
	rc, err := s.Get(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Corrupt(a.ID); err != nil {
		t.Fatal(err)
	}
	// A reader opened before the damage sees the good bytes.
	if got, err := io.ReadAll(rc); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("reader opened before Corrupt: %v", err)
	}
	if _, err := cas.ReadAll(ctx, s, a.ID); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("read after Corrupt: err = %v", err)
	}
	if err := s.Corrupt(cas.ZeroID); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("corrupt missing: err = %v", err)
	}
	empty, _, _ := s.Put(ctx, bytes.NewReader(nil))
	if err := s.Corrupt(empty.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cas.ReadAll(ctx, s, empty.ID); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("read of corrupted empty object: err = %v", err)
	}
}
