package cas

import (
	"bytes"
	"context"
	"io"
)

// Info describes a stored object.
type Info struct {
	ID   ID    `json:"id"`
	Size int64 `json:"size"`
}

// Getter reads objects.
type Getter interface {
	// Get opens the object id. A missing object is ErrNotFound. The caller
	// closes the reader. The reader hashes what it returns: if the bytes do
	// not match id, the read that reaches the end returns ErrCorrupt instead
	// of io.EOF, so a consumer that reads to the end never takes corrupted
	// bytes as complete content. Bytes read before that error must be
	// discarded: consumers stage them and publish only after a clean EOF.
	Get(ctx context.Context, id ID) (io.ReadCloser, error)
}

// Putter writes objects.
type Putter interface {
	// Put stores the bytes of r and returns their id and size. It hashes
	// while writing and publishes the object only once it is durable: after
	// Put returns, a crash never leaves a partial object under id. Storing an
	// object that already exists is success (created false) and leaves the
	// stored copy untouched. Put reads r to EOF; it does not close it.
	Put(ctx context.Context, r io.Reader) (info Info, created bool, err error)
}

// Haser answers whether objects exist without opening them.
type Haser interface {
	// Has reports whether id is stored. It does not verify the content.
	Has(ctx context.Context, id ID) (bool, error)
}

// Statter describes objects.
type Statter interface {
	// Stat returns the size of the object id, or ErrNotFound.
	Stat(ctx context.Context, id ID) (Info, error)
}

// Walker lists objects.
type Walker interface {
	// Walk calls fn for every stored object, in no particular order, on the
	// caller's goroutine. Objects put or deleted during a walk may or may not
	// be seen. An error from fn stops the walk and is returned.
	Walk(ctx context.Context, fn func(Info) error) error
}

// Deleter removes objects.
type Deleter interface {
	// Delete removes id. Deleting a missing object is success: GC may race
	// with itself and must stay idempotent.
	Delete(ctx context.Context, id ID) error
}

// DeletionCounter is implemented by stores that count the removals of
// their objects, so a caller that saw an object present can trust it still
// is without asking again (ingest.StatCache): while Deletions returns the
// count it returned when the object was known present, nothing was removed.
type DeletionCounter interface {
	// Deletions returns a number that changes before any removal of a
	// stored object takes effect and again once it has; ok is false when
	// the store does not count (a wrapper around one that does not).
	Deletions() (n uint64, ok bool)
}

// Store is the whole seam: the embedded disk store, the in-memory fake and
// later the remote tiers implement it, and cas/castest holds them to it.
type Store interface {
	Getter
	Putter
	Haser
	Statter
	Walker
	Deleter
}

// ReadAll reads a whole object and checks it against id before returning it.
// Use it for small objects such as trees; stream blobs with Get.
func ReadAll(ctx context.Context, g Getter, id ID) ([]byte, error) {
	rc, err := g.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return readAllFrom(rc, id)
}

// readAllFrom is ReadAll of the object id opened as rc, which it closes.
func readAllFrom(rc io.ReadCloser, id ID) ([]byte, error) {
	defer rc.Close()
	// Read into a buffer of the object's size when the store says it:
	// growing one by doubling would copy a tree of tens of megabytes a
	// dozen times and leave twice its size as garbage.
	size := int64(512)
	if n, ok := readerSize(rc); ok && n >= 0 && n < 1<<30 {
		size = n
	}
	b := make([]byte, 0, size+1)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := rc.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	// The reader verified at EOF already; this check also covers Getters
	// that do not (a defect we would rather catch here than serve).
	if Sum(b) != id {
		return nil, corruptError(id)
	}
	return b, nil
}

func bytesReader(b []byte) io.Reader { return &wholeReader{Reader: bytes.NewReader(b), b: b} }

// wholeReader is a reader over bytes held in memory that hands them over
// whole (Bytes) to a Putter that wants them at once, which then needs no
// copy of a tree that may be tens of megabytes.
type wholeReader struct {
	*bytes.Reader
	b []byte
}

// Bytes returns the bytes not yet read.
func (r *wholeReader) Bytes() []byte { return r.b[len(r.b)-r.Len():] }
