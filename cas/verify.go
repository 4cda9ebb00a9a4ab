package cas

import (
	"fmt"
	"hash"
	"io"
	"io/fs"
)

func corruptError(id ID) error {
	return fmt.Errorf("object %s: content does not match its id: %w", id, ErrCorrupt)
}

// VerifyingReader wraps r, the claimed content of id, so that reaching EOF
// with bytes that do not hash to id returns ErrCorrupt instead of io.EOF.
// Stores use it to implement Get's contract.
//
// It also holds back the last byte until the whole object has verified: a
// reader that returns its final bytes with a nil error (an *os.File does)
// would otherwise hand out all of a corrupt object before the error, which
// a stream (a tar export) cannot take back.
func VerifyingReader(id ID, r io.ReadCloser) io.ReadCloser {
	return &holdLast{rc: &verifyingReader{id: id, r: r, h: NewHasher()}}
}

// readerSize is the size of what r reads when r knows it without a round
// trip: a file, a VerifyingReader over one, or a store's reader that says
// its object's size (ObjectSize).
func readerSize(r io.Reader) (int64, bool) {
	switch r := r.(type) {
	case interface{ ObjectSize() int64 }:
		return r.ObjectSize(), true
	case *holdLast:
		return readerSize(r.rc)
	case *verifyingReader:
		return readerSize(r.r)
	case interface{ Stat() (fs.FileInfo, error) }:
		if fi, err := r.Stat(); err == nil && fi.Mode().IsRegular() {
			return fi.Size(), true
		}
	}
	return 0, false
}

type verifyingReader struct {
	id  ID
	r   io.ReadCloser
	h   hash.Hash
	err error
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	if err == io.EOF {
		if IDFromHash(v.h) != v.id {
			// Bytes returned before EOF were already handed out: a consumer
			// must treat everything it read as unusable on this error (write
			// to a temporary name and publish only after a clean EOF).
			v.err = corruptError(v.id)
			return 0, v.err
		}
		v.err = io.EOF
	} else if err != nil {
		v.err = err
	}
	return n, err
}

func (v *verifyingReader) Close() error { return v.r.Close() }

// holdLast passes rc through but releases the final byte only after rc
// returned io.EOF; any other error keeps it back for good.
type holdLast struct {
	rc   io.ReadCloser
	last byte  // the byte held back
	has  bool  // last is set
	err  error // sticky error of rc, io.EOF included
	one  [1]byte
}

func (h *holdLast) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if h.err != nil {
			if h.err == io.EOF && h.has {
				p[0], h.has = h.last, false
				return 1, nil
			}
			return 0, h.err
		}
		switch {
		case !h.has:
			n, err := h.rc.Read(p)
			h.err = err
			if n > 0 {
				h.last, h.has = p[n-1], true
				if n > 1 {
					return n - 1, nil
				}
			}
		case len(p) == 1:
			n, err := h.rc.Read(h.one[:])
			h.err = err
			if n == 1 {
				p[0], h.last = h.last, h.one[0]
				return 1, nil
			}
		default:
			// p[0] takes the held byte; the new bytes land after it and
			// the newest one is held back in its place.
			n, err := h.rc.Read(p[1:])
			h.err = err
			if n > 0 {
				p[0], h.last = h.last, p[n]
				return n, nil
			}
		}
	}
}

func (h *holdLast) Close() error { return h.rc.Close() }
