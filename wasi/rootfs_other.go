//go:build !linux

package wasi

import (
	"fmt"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// rootFS needs openat2(RESOLVE_IN_ROOT); elsewhere there is none, and a
// DirFS fallback would let symlinks escape, so Run refuses.
type rootFS struct {
	experimentalsys.UnimplementedFS
}

func openRootFS(dir string, readOnly bool) (*rootFS, error) {
	return nil, fmt.Errorf("confine %s: %w", dir, ErrUnsupported)
}

func (r *rootFS) close() error { return nil }

// ReadModule is refused where a root cannot be confined.
func ReadModule(root, guestPath string) ([]byte, error) {
	return nil, fmt.Errorf("read module %s in %s: %w", guestPath, root, ErrUnsupported)
}
