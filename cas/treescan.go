package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
)

// ScanTree reads the tree id through g and calls fn with its directory
// attributes once, then with each entry in order, holding a window of the
// encoding rather than the whole of it: a directory of a million entries
// costs tens of kilobytes, not the tens of megabytes a TreeView holds. For
// readers that pass over a tree once and need no entry twice (checking
// that a tree's objects are stored).
//
// It accepts exactly what ParseTree accepts and fails with ErrCorrupt where
// ParseTree would. But fn sees the directory and entries before the end of
// the object has been read and its hash checked: a corrupt tree makes
// ScanTree fail after fn has seen some of it, so fn must only do what such
// a failure leaves harmless. The entry passed to fn is valid only during
// the call. An error from fn ends the scan and is returned as it is.
func ScanTree(ctx context.Context, g Getter, id ID, attr func(*Attr) error, fn func(*Entry) error) error {
	rc, err := g.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("read tree %s: %w", id, err)
	}
	defer rc.Close()
	s := &treeScan{r: rc, h: NewHasher(), buf: make([]byte, 0, scanWindow)}
	err = s.scan(attr, fn)
	var cerr *scanCorrupt
	switch {
	case errors.As(err, &cerr):
		return fmt.Errorf("tree %s: decode tree: %v: %w", id, cerr.err, ErrCorrupt)
	case errors.Is(err, errReadFailed):
		return fmt.Errorf("read tree %s: %w", id, s.rerr)
	case err != nil:
		return err
	}
	// The reader verified at EOF already; this also covers Getters that do
	// not, as ReadAll does.
	if IDFromHash(s.h) != id {
		return fmt.Errorf("read tree %s: %w", id, corruptError(id))
	}
	return nil
}

// ReadTreeViewUpTo is ReadTreeView for a tree the store says is at most
// max bytes; a larger one is not read and the view is nil (ScanTree reads
// it in a window). A tree whose size the store does not tell is read.
func ReadTreeViewUpTo(ctx context.Context, g Getter, id ID, max int64) (*TreeView, error) {
	rc, err := g.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("read tree %s: %w", id, err)
	}
	if n, ok := readerSize(rc); ok && n > max {
		rc.Close()
		return nil, nil
	}
	raw, err := readAllFrom(rc, id)
	if err != nil {
		return nil, fmt.Errorf("read tree %s: %w", id, err)
	}
	v, err := ParseTree(raw)
	if err != nil {
		return nil, fmt.Errorf("tree %s: %w", id, err)
	}
	return v, nil
}

// scanWindow is ScanTree's first window; it grows to hold an entry larger
// than itself.
const scanWindow = 64 << 10

// treeScan is ScanTree's state: buf[pos:] is what has been read and not
// yet decoded.
type treeScan struct {
	r    io.Reader
	h    hash.Hash
	buf  []byte
	read uint64 // bytes read so far
	pos  int
	eof  bool
	rerr error // the reader's error, other than io.EOF
}

// scanCorrupt is an encoding ParseTree rejects.
type scanCorrupt struct{ err error }

func (e *scanCorrupt) Error() string { return e.err.Error() }

var errReadFailed = errors.New("read failed")

// fill reads more into the window, growing it when it is full of one
// undecoded record. It returns false at the end of the object.
func (s *treeScan) fill() (bool, error) {
	if s.eof {
		return false, nil
	}
	if s.pos > 0 {
		n := copy(s.buf, s.buf[s.pos:])
		s.buf, s.pos = s.buf[:n], 0
	}
	if len(s.buf) == cap(s.buf) {
		grown := make([]byte, len(s.buf), 2*cap(s.buf))
		copy(grown, s.buf)
		s.buf = grown
	}
	for {
		n, err := s.r.Read(s.buf[len(s.buf):cap(s.buf)])
		s.h.Write(s.buf[len(s.buf) : len(s.buf)+n])
		s.buf = s.buf[:len(s.buf)+n]
		if s.read += uint64(n); s.read >= math.MaxUint32 {
			return false, &scanCorrupt{fmt.Errorf("tree of %d bytes or more", s.read)}
		}
		if err == io.EOF {
			s.eof = true
			return n > 0, nil
		}
		if err != nil {
			s.rerr = err
			return false, errReadFailed
		}
		if n > 0 {
			return true, nil
		}
	}
}

// decode runs dec on the undecoded bytes until it succeeds, reading more
// while it fails for want of them. dec returns the bytes it did not use.
func (s *treeScan) decode(dec func(b []byte) ([]byte, error)) error {
	for {
		rest, err := dec(s.buf[s.pos:])
		if err == nil {
			s.pos = len(s.buf) - len(rest)
			return nil
		}
		more, ferr := s.fill()
		if ferr != nil {
			return ferr
		}
		if !more {
			return &scanCorrupt{err}
		}
	}
}

func (s *treeScan) scan(attrFn func(*Attr) error, fn func(*Entry) error) error {
	var a Attr
	var n uint64
	err := s.decode(func(b []byte) ([]byte, error) {
		a = Attr{}
		if !bytes.HasPrefix(b, treeMagic) {
			if len(b) < len(treeMagic) && bytes.HasPrefix(treeMagic, b) {
				return nil, errors.New("truncated")
			}
			return nil, errors.New("not a version 1 tree")
		}
		d := decoder{b: b[len(treeMagic):]}
		d.attr(&a)
		a.Xattrs = d.xattrs()
		// ParseTree bounds the count by the bytes that follow; here the
		// entries must all be there, which implies that bound.
		n = d.uvarint(math.MaxUint32)
		return d.b, d.err
	})
	if err != nil {
		return err
	}
	if err := validateAttr(&a); err != nil {
		return &scanCorrupt{fmt.Errorf("directory: %w", err)}
	}
	if attrFn != nil {
		if err := attrFn(&a); err != nil {
			return err
		}
	}
	var prev string
	var e Entry
	for i := range n {
		err := s.decode(func(b []byte) ([]byte, error) {
			e = Entry{}
			d := decoder{b: b}
			d.entry(&e)
			return d.b, d.err
		})
		if err != nil {
			return err
		}
		if err := ValidName(e.Name); err != nil {
			return &scanCorrupt{err}
		}
		if i > 0 && prev >= e.Name {
			return &scanCorrupt{fmt.Errorf("entries not sorted or not unique at %q: %w", e.Name, ErrInvalidArgument)}
		}
		if err := validateEntry(&e); err != nil {
			return &scanCorrupt{fmt.Errorf("entry %q: %w", e.Name, err)}
		}
		prev = e.Name
		if err := fn(&e); err != nil {
			return err
		}
	}
	// Nothing may follow the last entry; reading to the end also lets the
	// reader check the hash.
	for {
		if len(s.buf) > s.pos {
			return &scanCorrupt{fmt.Errorf("%d trailing bytes", len(s.buf)-s.pos)}
		}
		more, err := s.fill()
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
	}
}
