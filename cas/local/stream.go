package local

import (
	"context"
	"hash"
	"io"
	"sync"
	"sync/atomic"
)

// A large object (one that does not fit in bufSize) goes through a
// two-stage pipeline: the calling goroutine reads a chunk and hashes it
// while one writer goroutine writes the chunk before it to the temp file.
// Hashing and writing then overlap instead of adding up.
//
// The writer also starts writeback of what it has written every
// writebackEvery bytes (see startWriteback), so the disk works while the
// rest is still being hashed and the final fsync or syncfs has less left
// to do. That only starts I/O early: the flush that makes the object
// durable before it is published is unchanged.
//
// Chunks are 512 KiB, measured on the 2-CPU bench machine (256 MiB into a
// batch, from the page cache): 1 MiB and larger write(2)s cost three to six
// times the kernel CPU of 512 KiB ones there, and 128-256 KiB ones gained
// less from the overlap.
const (
	chunkSize      = 512 << 10
	pipeDepth      = 3 // chunks per pipeline: one filling, up to two queued or being written
	writebackEvery = 8 << 20
)

var chunkPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

type chunk struct {
	b *[]byte
	n int
}

// stream writes first and then the rest of r through write, hashing
// everything into h, and returns the number of bytes written. fd is the
// file write writes to, for startWriteback. The writer goroutine has
// ended when stream returns, whatever happened; ctx is checked before
// every read.
func stream(ctx context.Context, r io.Reader, first []byte, h hash.Hash, fd int, write func([]byte) error) (int64, error) {
	full := make(chan chunk, pipeDepth)
	free := make(chan *[]byte, pipeDepth)
	done := make(chan struct{})
	var failed atomic.Bool
	var werr error // the writer's error, read after done
	go func() {
		defer close(done)
		var off, started int64
		for c := range full {
			// After a failure the writer only hands chunks back, so the
			// reader never waits forever for a free one.
			if werr == nil {
				if err := write((*c.b)[:c.n]); err != nil {
					werr = err
					failed.Store(true)
				} else {
					off += int64(c.n)
					if off-started >= writebackEvery {
						startWriteback(fd, started, off-started)
						started = off
					}
				}
			}
			free <- c.b // never blocks: there are at most pipeDepth chunks
		}
	}()

	allocated := 0
	var cur *[]byte // held by the reader, not yet handed to the writer
	next := func() *[]byte {
		if allocated < pipeDepth {
			allocated++
			return chunkPool.Get().(*[]byte)
		}
		return <-free
	}
	// finish stops the writer and returns every chunk to the pool; the
	// ones not held by the reader are all in free once the writer ended.
	finish := func() {
		close(full)
		<-done
		if cur != nil {
			chunkPool.Put(cur)
			allocated--
		}
		for ; allocated > 0; allocated-- {
			chunkPool.Put(<-free)
		}
	}

	var size int64
	cur = next()
	n := copy(*cur, first)
	m, eof, err := fill(ctx, r, (*cur)[n:])
	n += m
	for err == nil {
		if n > 0 {
			// The writer and the hasher only read the chunk; it is
			// refilled only after the writer hands it back.
			full <- chunk{b: cur, n: n}
			h.Write((*cur)[:n])
			size += int64(n)
			cur = nil
		}
		if eof || failed.Load() {
			break
		}
		if cur == nil {
			cur = next()
		}
		n, eof, err = fill(ctx, r, *cur)
	}
	finish()
	if err != nil {
		return size, err
	}
	return size, werr
}
