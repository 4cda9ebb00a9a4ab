package cas

import (
	"fmt"
	"hash"
	"io"
)

func corruptError(id ID) error {
	return fmt.Errorf("object %s: content does not match its id: %w", id, ErrCorrupt)
}

// VerifyingReader wraps r, the claimed content of id, so that reaching EOF
// with bytes that do not hash to id returns ErrCorrupt instead of io.EOF.
// Stores use it to implement Get's contract.
func VerifyingReader(id ID, r io.ReadCloser) io.ReadCloser {
	return &verifyingReader{id: id, r: r, h: NewHasher()}
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
