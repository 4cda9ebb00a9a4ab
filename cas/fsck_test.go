package cas_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/cas/mem"
)

// fsckTarget is a store under test plus a way to damage it.
type fsckTarget struct {
	name  string
	store func(t *testing.T) (cas.Store, func(t *testing.T, id cas.ID))
}

// rawLocal serves object files unverified, like a buggy tier would.
type rawLocal struct{ *local.Store }

func (r rawLocal) Get(_ context.Context, id cas.ID) (io.ReadCloser, error) {
	f, err := os.Open(r.Path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("get: %w", cas.ErrNotFound)
	}
	return f, err
}

func flipLocal(s *local.Store) func(t *testing.T, id cas.ID) {
	return func(t *testing.T, id cas.ID) {
		p := s.Path(id)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 1
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o444); err != nil {
			t.Fatal(err)
		}
	}
}

var fsckTargets = []fsckTarget{
	{name: "mem", store: func(t *testing.T) (cas.Store, func(*testing.T, cas.ID)) {
		s := mem.New()
		return s, func(t *testing.T, id cas.ID) {
			if err := s.Corrupt(id); err != nil {
				t.Fatal(err)
			}
		}
	}},
	{name: "local", store: func(t *testing.T) (cas.Store, func(*testing.T, cas.ID)) {
		s, err := local.Open(t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return s, flipLocal(s)
	}},
	// A Get that does not verify: Fsck must hash on its own.
	{name: "local-unverified-get", store: func(t *testing.T) (cas.Store, func(*testing.T, cas.ID)) {
		s, err := local.Open(t.TempDir(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return rawLocal{s}, flipLocal(s)
	}},
}

func TestFsckReportsFlippedBytes(t *testing.T) {
	ctx := context.Background()
	for _, tg := range fsckTargets {
		t.Run(tg.name, func(t *testing.T) {
			st, corrupt := tg.store(t)
			var ids []cas.ID
			var total int64
			for i := range 40 {
				b := bytes.Repeat([]byte{byte(i)}, 1+i*9000) // up to ~350 KiB
				info, _, err := st.Put(ctx, bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, info.ID)
				total += info.Size
			}
			res, err := cas.Fsck(ctx, st, func(id cas.ID, err error) { t.Errorf("clean store: reported %s: %v", id.Short(), err) })
			if err != nil || res.Checked != 40 || res.Bytes != total || len(res.Bad) != 0 || res.Vanished != 0 {
				t.Fatalf("fsck of clean store = %+v, %v; want 40 checked, %d bytes, none bad", res, err, total)
			}

			bad := []cas.ID{ids[3], ids[17], ids[39]}
			for _, id := range bad {
				corrupt(t, id)
			}
			slices.SortFunc(bad, func(a, b cas.ID) int { return bytes.Compare(a[:], b[:]) })
			reported := map[cas.ID]error{}
			res, err = cas.Fsck(ctx, st, func(id cas.ID, err error) { reported[id] = err })
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(res.Bad, bad) || res.Checked != 40 {
				t.Fatalf("fsck after flipping 3 objects: bad %v of %d checked, want %v (sorted)", short(res.Bad), res.Checked, short(bad))
			}
			for _, id := range bad {
				if !errors.Is(reported[id], cas.ErrCorrupt) {
					t.Errorf("report for %s: %v, want ErrCorrupt", id.Short(), reported[id])
				}
			}
			if len(reported) != len(bad) {
				t.Errorf("reported %d objects, want %d", len(reported), len(bad))
			}
		})
	}
}

func short(ids []cas.ID) []string {
	var s []string
	for _, id := range ids {
		s = append(s, id.Short())
	}
	return s
}

// ghostWalker lists one object that is not there, as if GC deleted it
// between Walk and Get.
type ghostWalker struct{ *mem.Store }

func (g ghostWalker) Walk(ctx context.Context, fn func(cas.Info) error) error {
	if err := fn(cas.Info{ID: cas.Sum([]byte("ghost")), Size: 5}); err != nil {
		return err
	}
	return g.Store.Walk(ctx, fn)
}

func TestFsckVanishedAndUnreadable(t *testing.T) {
	ctx := context.Background()
	s := mem.New()
	s.Put(ctx, bytes.NewReader([]byte("a")))
	b, _, _ := s.Put(ctx, bytes.NewReader([]byte("b")))
	eio := errors.New("EIO")
	s.SetFault(func(op mem.Op, id cas.ID) error {
		if op == mem.OpGet && id == b.ID {
			return eio
		}
		return nil
	})
	var got error
	res, err := cas.Fsck(ctx, ghostWalker{s}, func(id cas.ID, err error) { got = err })
	if err != nil {
		t.Fatal(err)
	}
	if res.Vanished != 1 || res.Checked != 2 || !slices.Equal(res.Bad, []cas.ID{b.ID}) || !errors.Is(got, eio) {
		t.Fatalf("fsck = %+v (report %v); want 1 vanished, 2 checked, %s bad with the read error", res, got, b.ID.Short())
	}
}

func TestFsckStopsOnCancel(t *testing.T) {
	s := mem.New()
	for i := range 50 {
		s.Put(context.Background(), bytes.NewReader([]byte{byte(i)}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	// Cancel from inside the first Get, so work is under way.
	s.SetFault(func(op mem.Op, _ cas.ID) error {
		if op == mem.OpGet {
			cancel()
		}
		return nil
	})
	res, err := cas.Fsck(ctx, s, func(id cas.ID, err error) { t.Errorf("cancellation blamed on %s: %v", id.Short(), err) })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("fsck cancelled mid-run: err = %v", err)
	}
	if res.Checked >= 50 {
		t.Fatalf("fsck checked all %d objects despite cancellation", res.Checked)
	}
	if gets := s.Stats().Get; gets >= 50 {
		t.Fatalf("fsck kept reading after cancellation: %d gets", gets)
	}
}

func TestFsckWalkError(t *testing.T) {
	s := mem.New()
	s.Put(context.Background(), bytes.NewReader([]byte("x")))
	broken := errors.New("listing failed")
	s.SetFault(func(op mem.Op, _ cas.ID) error {
		if op == mem.OpWalk {
			return broken
		}
		return nil
	})
	if _, err := cas.Fsck(context.Background(), s, nil); !errors.Is(err, broken) {
		t.Fatalf("fsck with failing walk: err = %v", err)
	}
}
