//go:build linux

package local_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/castest"
)

func TestBatchConformance(t *testing.T) {
	castest.RunBatch(t, func(t *testing.T) cas.Store { return harness{open(t, t.TempDir())} })
}

// Objects a batch commits look exactly like Put's: same path, read-only,
// and there after the store is reopened.
func TestBatchLayoutModeAndReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir)
	b := s.NewBatch()
	defer b.Abort()
	var blobs [][]byte
	for _, size := range []int{0, 5, 4096, 1 << 20} {
		c := make([]byte, size)
		rand.Read(c)
		blobs = append(blobs, c)
		if _, _, err := b.Put(ctx, bytes.NewReader(c)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, dir)
	for _, c := range blobs {
		p := s2.Path(cas.Sum(c))
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o444 || fi.Size() != int64(len(c)) {
			t.Fatalf("committed object file mode %v size %d, want -r--r--r-- %d", fi.Mode(), fi.Size(), len(c))
		}
		if got, err := cas.ReadAll(ctx, s2, cas.Sum(c)); err != nil || !bytes.Equal(got, c) {
			t.Fatalf("after reopen: %d-byte object: %v", len(c), err)
		}
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("cannot count open files: %v", err)
	}
	return len(ents)
}

// A batch holds one descriptor from its first Put until it ends, however it
// ends, and none for its objects.
func TestBatchReleasesDescriptors(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	for _, end := range []string{"commit", "abort", "failed commit"} {
		before := openFDs(t)
		b := s.NewBatch()
		for i := range 20 {
			if _, _, err := b.Put(ctx, bytes.NewReader([]byte{byte(i), 1, 2})); err != nil {
				t.Fatal(err)
			}
		}
		if during := openFDs(t); during != before+1 {
			t.Fatalf("open batch of 20 objects holds %d descriptors, want 1", during-before)
		}
		switch end {
		case "commit":
			if err := b.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		case "abort":
			b.Abort()
		case "failed commit":
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			if err := b.Commit(cctx); err == nil {
				t.Fatal("commit with a cancelled context succeeded")
			}
		}
		if after := openFDs(t); after != before {
			t.Fatalf("after %s: %d descriptors open, want %d", end, after, before)
		}
	}
}

// benchBatchPut puts b.N new 4 KiB objects into batches of batchSize,
// committing each, from one goroutine or from several. The time per op is
// per object, commits included.
func benchBatchPut(b *testing.B, batchSize, workers int) {
	ctx := context.Background()
	s := open(b, b.TempDir())
	const size = 4 << 10
	base := make([]byte, size)
	rand.Read(base)
	var seq atomic.Uint64
	var commit time.Duration
	b.SetBytes(size)
	b.ResetTimer()
	for done := 0; done < b.N; done += batchSize {
		n := min(batchSize, b.N-done)
		bt := s.NewBatch()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				buf := bytes.Clone(base)
				// Worker w puts objects w, w+workers, ... of this batch.
				for i := w; i < n; i += workers {
					// Distinct content each time: the first 8 bytes count.
					binary.LittleEndian.PutUint64(buf, seq.Add(1))
					if _, _, err := bt.Put(ctx, bytes.NewReader(buf)); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		start := time.Now()
		if err := bt.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		commit += time.Since(start)
	}
	// The share of Commit (syncfs, renames, syncfs) in the time per object.
	b.ReportMetric(float64(commit.Nanoseconds())/float64(b.N), "commit-ns/op")
}

func BenchmarkBatchPutNew4K(b *testing.B)         { benchBatchPut(b, 1000, 1) }
func BenchmarkBatchPutNew4KParallel(b *testing.B) { benchBatchPut(b, 1000, 4) }

// BenchmarkBatchPutNew256M puts one new 256 MiB object per batch and
// commits it: the seal of a delta of one large file.
func BenchmarkBatchPutNew256M(b *testing.B) {
	ctx := context.Background()
	s := open(b, b.TempDir())
	const size = 256 << 20
	buf := make([]byte, size)
	rand.Read(buf)
	b.SetBytes(size)
	for i := uint64(0); b.Loop(); i++ {
		binary.LittleEndian.PutUint64(buf, i)
		bt := s.NewBatch()
		if _, _, err := bt.Put(ctx, bytes.NewReader(buf)); err != nil {
			b.Fatal(err)
		}
		if err := bt.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
