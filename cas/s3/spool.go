package s3

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/esf-dev/esf/cas"
)

// spooled is an object read from a caller and hashed, held in memory or,
// past memLimit, in an unlinked-on-close temp file, so that it can be sent
// (and re-sent by the retryer) with a known length and id.
type spooled struct {
	id   cas.ID
	size int64
	mem  []byte
	f    *os.File
}

func (sp *spooled) info() cas.Info { return cas.Info{ID: sp.id, Size: sp.size} }

// reader is a fresh seekable reader of the bytes.
func (sp *spooled) reader() io.ReadSeeker {
	if sp.f != nil {
		return io.NewSectionReader(sp.f, 0, sp.size)
	}
	return bytes.NewReader(sp.mem)
}

// Close removes the temp file, if any.
func (sp *spooled) Close() {
	if sp.f != nil {
		name := sp.f.Name()
		sp.f.Close()
		os.Remove(name)
		sp.f = nil
	}
}

// spool reads r to EOF while hashing; the context is checked between
// reads, so a cancelled Put stops without reading the rest.
func spool(ctx context.Context, r io.Reader, tmp string) (*spooled, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h := cas.NewHasher()
	sp := &spooled{}
	buf := make([]byte, 256<<10)
	var mem bytes.Buffer
	fail := func(err error) (*spooled, error) {
		sp.Close()
		return nil, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		n, rerr := r.Read(buf)
		if n > 0 {
			h.Write(buf[:n])
			sp.size += int64(n)
			if sp.f == nil && int64(mem.Len()+n) > memLimit {
				f, err := os.CreateTemp(tmp, "esf-s3-put-*")
				if err != nil {
					return fail(fmt.Errorf("s3 put: %w", err))
				}
				sp.f = f
				if _, err := f.Write(mem.Bytes()); err != nil {
					return fail(fmt.Errorf("s3 put: %w", err))
				}
				mem = bytes.Buffer{}
			}
			if sp.f != nil {
				if _, err := sp.f.Write(buf[:n]); err != nil {
					return fail(fmt.Errorf("s3 put: %w", err))
				}
			} else {
				mem.Write(buf[:n])
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fail(rerr)
		}
	}
	// The reader may have finished just as the caller gave up.
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	sp.id = cas.IDFromHash(h)
	if sp.f == nil {
		sp.mem = mem.Bytes()
	}
	return sp, nil
}
