package cas

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// TestVerifyingReaderNeverReleasesCorruptContentWhole reads verified
// streams with every read size pattern: intact content comes out
// whole, corrupt content always comes out at least one byte short, even
// when the underlying reader reports EOF only on a read of its own (as an
// *os.File does).
func TestVerifyingReaderNeverReleasesCorruptContentWhole(t *testing.T) {
	good := bytes.Repeat([]byte("content-"), 1000)
	id := Sum(good)
	bad := bytes.Clone(good)
	bad[len(bad)-1] ^= 1

	wrappers := map[string]func(io.Reader) io.Reader{
		"plain":     func(r io.Reader) io.Reader { return r },
		"one byte":  iotest.OneByteReader,
		"half":      iotest.HalfReader,
		"data+EOF":  iotest.DataErrReader,
		"separated": func(r io.Reader) io.Reader { return struct{ io.Reader }{r} },
	}
	for name, wrap := range wrappers {
		for _, bufSize := range []int{1, 2, 7, 4096, 1 << 20} {
			read := func(content []byte) ([]byte, error) {
				h := VerifyingReader(id, io.NopCloser(wrap(bytes.NewReader(content))))
				var out []byte
				buf := make([]byte, bufSize)
				for {
					n, err := h.Read(buf)
					out = append(out, buf[:n]...)
					if err == io.EOF {
						return out, nil
					}
					if err != nil {
						return out, err
					}
				}
			}
			out, err := read(good)
			if err != nil || !bytes.Equal(out, good) {
				t.Errorf("%s/%d: intact content: %d bytes, %v", name, bufSize, len(out), err)
			}
			out, err = read(bad)
			if !errors.Is(err, ErrCorrupt) || len(out) >= len(bad) {
				t.Errorf("%s/%d: corrupt content: %d of %d bytes released, %v", name, bufSize, len(out), len(bad), err)
			}
		}
	}
	// The reader contract of intact content, checked by the standard library.
	h := VerifyingReader(id, io.NopCloser(bytes.NewReader(good)))
	if err := iotest.TestReader(h, good); err != nil {
		t.Error(err)
	}
}
