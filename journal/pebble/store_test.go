package pebble_test

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/journaltest"
	jpebble "github.com/esf-dev/esf/journal/pebble"
)

func TestConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T, o journaltest.Options) journal.Store {
		s, err := jpebble.Open("db", jpebble.Options{FS: vfs.NewMem(), Now: o.Now, Failpoint: o.Failpoint})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestConformanceOnDisk runs the suite once against the real filesystem, so
// fsync, locking and directory handling are exercised, not only the vfs.
func TestConformanceOnDisk(t *testing.T) {
	journaltest.Run(t, func(t *testing.T, o journaltest.Options) journal.Store {
		s, err := jpebble.Open(t.TempDir(), jpebble.Options{Now: o.Now, Failpoint: o.Failpoint})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestLargeValuesInBlobFiles: values of a data block and more go to blob
// files once flushed, and read back whole, also after a reopen and after
// they were deleted and rewritten.
func TestLargeValuesInBlobFiles(t *testing.T) {
	dir := t.TempDir()
	open := func() *jpebble.Store {
		s, err := jpebble.Open(dir, jpebble.Options{MemTableSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ctx := t.Context()
	value := func(i, gen int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("%04d-%d;", i, gen)), 64<<10/7)
	}
	put := func(s *jpebble.Store, gen int) {
		t.Helper()
		for i := range 40 {
			err := s.Update(ctx, func(tx journal.Tx) error {
				return errors.Join(tx.Put(fmt.Appendf(nil, "big/%04d", i), value(i, gen)),
					tx.Put(fmt.Appendf(nil, "small/%04d", i), []byte("s")))
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(s *jpebble.Store, gen int) {
		t.Helper()
		err := s.View(ctx, func(r journal.Reader) error {
			for i := range 40 {
				got, err := r.Get(fmt.Appendf(nil, "big/%04d", i))
				if err != nil {
					return err
				}
				if !bytes.Equal(got, value(i, gen)) {
					return fmt.Errorf("big/%04d: %d bytes, not generation %d's value", i, len(got), gen)
				}
				if _, err := r.Get(fmt.Appendf(nil, "big/%04d-absent", i)); !errors.Is(err, journal.ErrNotFound) {
					return fmt.Errorf("absent key next to big/%04d: %v", i, err)
				}
			}
			n := 0
			err := r.Scan([]byte("big/"), []byte("big0"), func(k, v []byte) error {
				if len(v) != len(value(0, gen)) {
					return fmt.Errorf("scan %s: %d bytes", k, len(v))
				}
				n++
				return nil
			})
			if err == nil && n != 40 {
				err = fmt.Errorf("scan found %d big values, want 40", n)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s := open()
	put(s, 1) // 2.5 MiB: the 1 MiB memtable flushes on the way
	check(s, 1)
	blobs, err := filepath.Glob(filepath.Join(dir, "*.blob"))
	if err != nil || len(blobs) == 0 {
		t.Fatalf("no blob files after flushing 2.5 MiB of 64 KiB values: %v, %v", blobs, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	check(s, 1)
	put(s, 2)
	check(s, 2)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	defer s.Close()
	check(s, 2)
}
