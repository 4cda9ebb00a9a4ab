//go:build linux

package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/cas"
)

// randomBytes returns n bytes from a generator seeded with seed.
func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	var s [32]byte
	s[0], s[1] = byte(seed), byte(seed>>8)
	rand.NewChaCha8(s).Read(b)
	return b
}

// shortReader returns at most max bytes per Read, so reads end anywhere
// within Put's buffers and chunks.
type shortReader struct {
	r   io.Reader
	max int
}

func (s *shortReader) Read(p []byte) (int, error) {
	return s.r.Read(p[:min(len(p), s.max)])
}

// failingReader serves data, then fails with err (after calling before,
// if set) once it has served after bytes.
type failingReader struct {
	data   []byte
	after  int
	err    error
	before func()
	off    int
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.off >= f.after {
		if f.before != nil {
			f.before()
		}
		return 0, f.err
	}
	n := copy(p[:min(len(p), f.after-f.off)], f.data[f.off:])
	f.off += n
	return n, nil
}

// noPipelineLeft fails if a pipeline writer goroutine is still running.
// Put waits for it to signal its end, after which it has only to return;
// a goroutine still there after a grace period is blocked, a real leak.
func noPipelineLeft(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(2 * time.Second)
	for {
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "cas/local.stream.func") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a pipeline goroutine outlived its Put:\n%s", stacks)
		}
		time.Sleep(time.Millisecond)
	}
}

func tempNames(t *testing.T, s *Store) []string {
	t.Helper()
	ents, err := os.ReadDir(s.tmp)
	if err != nil {
		t.Fatal(err)
	}
	redo := redoRecords(s)
	var names []string
	for _, e := range ents {
		if !redo[e.Name()] {
			names = append(names, e.Name())
		}
	}
	return names
}

func objectCount(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	if err := s.Walk(context.Background(), func(cas.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// putters are the two ways into the store: Put, and a batch's Put then
// Commit.
var putters = []struct {
	name string
	put  func(ctx context.Context, s *Store, r io.Reader) (cas.Info, bool, error)
}{
	{"Put", func(ctx context.Context, s *Store, r io.Reader) (cas.Info, bool, error) { return s.Put(ctx, r) }},
	{"Batch", func(ctx context.Context, s *Store, r io.Reader) (cas.Info, bool, error) {
		b := s.NewBatch()
		defer b.Abort()
		info, created, err := b.Put(ctx, r)
		if err != nil {
			return info, created, err
		}
		return info, created, b.Commit(ctx)
	}},
}

// Every size around the in-memory threshold (bufSize), the pipeline's
// chunks and its writeback step is stored whole, under its BLAKE3 id,
// read-only, with no temp file or goroutine left, and stored once.
func TestPutAcrossChunkBoundaries(t *testing.T) {
	sizes := []int{0, 1, bufSize - 1, bufSize, bufSize + 1,
		chunkSize - 1, chunkSize, chunkSize + 1, chunkSize + bufSize,
		2*chunkSize + 3, int(writebackEvery) + 1, 3*chunkSize + 7}
	ctx := context.Background()
	for _, p := range putters {
		for _, shape := range []string{"whole", "short"} {
			t.Run(p.name+"/"+shape, func(t *testing.T) {
				s, err := Open(t.TempDir(), nil)
				if err != nil {
					t.Fatal(err)
				}
				for i, size := range sizes {
					content := randomBytes(size, uint64(i))
					var r io.Reader = bytes.NewReader(content)
					if shape == "short" {
						// A prime, so reads straddle every boundary.
						r = &shortReader{r: r, max: 100_003}
					}
					info, created, err := p.put(ctx, s, r)
					noPipelineLeft(t)
					if err != nil {
						t.Fatalf("size %d: %v", size, err)
					}
					if want := cas.Sum(content); info.ID != want || info.Size != int64(size) || !created {
						t.Fatalf("size %d: got %s/%d created %v, want %s/%d created", size, info.ID.Short(), info.Size, created, want.Short(), size)
					}
					got, err := os.ReadFile(s.Path(info.ID))
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, content) {
						t.Fatalf("size %d: stored bytes differ from the content", size)
					}
					fi, err := os.Stat(s.Path(info.ID))
					if err != nil || fi.Mode().Perm() != 0o444 {
						t.Fatalf("size %d: mode %v (%v), want 0444", size, fi.Mode(), err)
					}
					ino := fi.Sys().(*syscall.Stat_t).Ino
					// Stored already: not rewritten, nothing left behind.
					info2, created, err := p.put(ctx, s, bytes.NewReader(content))
					noPipelineLeft(t)
					if err != nil || created || info2 != info {
						t.Fatalf("size %d again: %+v created %v, %v", size, info2, created, err)
					}
					if fi, err := os.Stat(s.Path(info.ID)); err != nil || fi.Sys().(*syscall.Stat_t).Ino != ino {
						t.Fatalf("size %d: the stored copy was replaced (%v)", size, err)
					}
					if left := tempNames(t, s); len(left) != 0 {
						t.Fatalf("size %d: temp files left: %v", size, left)
					}
				}
				if n := objectCount(t, s); n != len(sizes) {
					t.Fatalf("%d objects stored, want %d", n, len(sizes))
				}
			})
		}
	}
}

// A Put whose reader fails, or whose context is cancelled, at any stage
// (inside the first buffer, in the pipeline's first chunk, a few chunks
// in) returns that error and leaves no temp file, no object and no
// goroutine.
func TestPutFailsMidway(t *testing.T) {
	errBoom := errors.New("boom")
	size := 4*chunkSize + 1
	content := randomBytes(size, 7)
	for _, p := range putters {
		for _, after := range []int{10, bufSize + 5, chunkSize + 1, 2*chunkSize + 7} {
			for _, cause := range []string{"reader", "cancel"} {
				t.Run(fmt.Sprintf("%s/%s/%d", p.name, cause, after), func(t *testing.T) {
					s, err := Open(t.TempDir(), nil)
					if err != nil {
						t.Fatal(err)
					}
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					r := &failingReader{data: content, after: after, err: errBoom}
					want := errBoom
					if cause == "cancel" {
						// Cancelled, and the reader never ends: only the
						// context can stop the Put.
						r.err, r.before = nil, cancel
						want = context.Canceled
					}
					_, _, err = p.put(ctx, s, r)
					noPipelineLeft(t)
					if !errors.Is(err, want) {
						t.Fatalf("err = %v, want %v", err, want)
					}
					if left := tempNames(t, s); len(left) != 0 {
						t.Fatalf("temp files left: %v", left)
					}
					if n := objectCount(t, s); n != 0 {
						t.Fatalf("%d objects stored by a failed Put", n)
					}
				})
			}
		}
	}
}

// When the writer fails, the reader stops within the pipeline's depth
// instead of reading the rest, and stream returns the write error with
// its goroutine ended.
func TestStreamWriteFails(t *testing.T) {
	errDisk := errors.New("disk full")
	var read countingReader
	writes := 0
	size, err := stream(context.Background(), &read, nil, cas.NewHasher(), -1, func(p []byte) error {
		if writes++; writes == 2 {
			return errDisk
		}
		return nil
	})
	noPipelineLeft(t)
	if !errors.Is(err, errDisk) {
		t.Fatalf("err = %v, want %v", err, errDisk)
	}
	if limit := int64((pipeDepth + 2) * chunkSize); read.n > limit || size > read.n {
		t.Fatalf("read %d bytes (hashed %d) after the write failed, want at most %d", read.n, size, limit)
	}
}

// countingReader is an endless source of zeros that counts what it served.
type countingReader struct{ n int64 }

func (c *countingReader) Read(p []byte) (int, error) {
	clear(p)
	c.n += int64(len(p))
	return len(p), nil
}
