package fusefs

import (
	"context"
	"io"
	"strconv"
	"strings"
	"syscall"

	"github.com/esf-dev/esf/cas"
)

// checkHoles makes sure, once per process for each blob and hole list,
// that every hole a file entry records reads as zeros in its blob before
// the file is served. Lseek answers SEEK_DATA from the holes, and
// overlayfs's copy-up, cp and tar skip what it calls a hole: a tree whose
// holes covered data would lose that data in every copy. Importers never
// write such a tree; this guards against one made by hand.
func (f *FS) checkHoles(ctx context.Context, e *cas.Entry) syscall.Errno {
	if len(e.Holes) == 0 {
		return 0
	}
	key := holesKey(e)
	f.mu.Lock()
	ok := f.holesChecked[key]
	f.mu.Unlock()
	if ok {
		return 0
	}
	// Not cancellable, like verify.
	rc, err := f.opts.Store.Get(context.WithoutCancel(ctx), e.ID)
	if err == nil {
		_, err = io.CopyBuffer(cas.NewHoleCheck(e.Holes), rc, make([]byte, verifyBuffer))
		rc.Close()
	}
	if err != nil {
		f.opts.Logger.Error("check holes", "blob", e.ID.String(), "err", err)
		return toErrno(err)
	}
	f.mu.Lock()
	f.holesChecked[key] = true
	f.mu.Unlock()
	return 0
}

func holesKey(e *cas.Entry) string {
	var b strings.Builder
	b.WriteString(e.ID.String())
	for _, h := range e.Holes {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(h.Off, 10))
		b.WriteByte('+')
		b.WriteString(strconv.FormatInt(h.Len, 10))
	}
	return b.String()
}
