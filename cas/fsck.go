package cas

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"sync"
)

// FsckStore is what Fsck needs: a list of objects and a way to read each.
type FsckStore interface {
	Walker
	Getter
}

// FsckResult summarises a Fsck run.
type FsckResult struct {
	// Checked counts objects read to the end and re-hashed (good or bad).
	Checked int64 `json:"checked"`
	// Bytes counts the bytes read from checked objects.
	Bytes int64 `json:"bytes"`
	// Vanished counts objects listed by Walk but gone when read: deleted by
	// a concurrent collection, not damage.
	Vanished int64 `json:"vanished"`
	// Bad lists, sorted, the objects whose bytes do not hash to their id or
	// that could not be read.
	Bad []ID `json:"bad,omitempty"`
}

// fsckWorkers bounds the objects Fsck reads at once: enough to overlap I/O
// with hashing, few enough not to starve the daemon it runs inside.
const fsckWorkers = 4

// Fsck re-reads every object of s and hashes it independently of the
// store's own verification. Each bad object is passed to report (if not nil)
// with the reason: ErrCorrupt for a mismatch, or the error that stopped the
// read. report is called one call at a time but not necessarily on the
// caller's goroutine, in no particular order; the result's Bad is sorted.
//
// Fsck returns an error only when it could not finish: the context ended or
// Walk failed. Damage is a result, not an error. Objects deleted during the
// run are counted as Vanished.
func Fsck(ctx context.Context, s FsckStore, report func(id ID, err error)) (FsckResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		mu  sync.Mutex
		res FsckResult
	)
	jobs := make(chan ID)
	var wg sync.WaitGroup
	for range min(fsckWorkers, max(1, runtime.GOMAXPROCS(0))) {
		wg.Go(func() {
			buf := make([]byte, 256<<10)
			for id := range jobs {
				n, err := fsckOne(ctx, s, id, buf)
				if ctx.Err() != nil {
					// Whatever went wrong, the run is over; do not blame
					// the object for it.
					continue
				}
				mu.Lock()
				switch {
				case errors.Is(err, ErrNotFound):
					res.Vanished++
				default:
					res.Checked++
					res.Bytes += n
					if err != nil {
						res.Bad = append(res.Bad, id)
						if report != nil {
							report(id, err)
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	walkErr := s.Walk(ctx, func(info Info) error {
		select {
		case jobs <- info.ID:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	close(jobs)
	wg.Wait()
	slices.SortFunc(res.Bad, func(a, b ID) int { return bytes.Compare(a[:], b[:]) })
	if walkErr != nil {
		return res, walkErr
	}
	// Walk may have listed everything just before the context ended while
	// workers dropped their objects: then the run is not complete.
	if err := ctx.Err(); err != nil {
		return res, err
	}
	return res, nil
}

// fsckOne reads id to the end through its own hasher and returns how many
// bytes it read. It does not trust the Getter to verify: a store that fails
// to is exactly what fsck exists to catch.
func fsckOne(ctx context.Context, g Getter, id ID, buf []byte) (int64, error) {
	rc, err := g.Get(ctx, id)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	h := NewHasher()
	n, err := io.CopyBuffer(h, rc, buf)
	if err != nil {
		return n, err
	}
	if IDFromHash(h) != id {
		return n, corruptError(id)
	}
	return n, nil
}
