package ingest

import (
	"bytes"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// readXattrs returns the extended attributes of p itself (never of a
// symlink's target), sorted by name: every namespace the kernel lists to
// us, which as root includes trusted.* and the binary system.posix_acl_*
// values. A filesystem without xattr support has none. Errors name show,
// not p (which may be a /proc/self/fd path).
func readXattrs(p, show string) ([]cas.Xattr, error) {
	xs, err := readXattrsOf(p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", show, err)
	}
	return xs, nil
}

func readXattrsOf(p string) ([]cas.Xattr, error) {
	list, err := llistxattr(p)
	if err != nil || len(list) == 0 {
		return nil, err
	}
	var xs []cas.Xattr
	for name := range bytes.SplitSeq(bytes.TrimRight(list, "\x00"), []byte{0}) {
		if len(name) == 0 {
			continue
		}
		v, ok, err := lgetxattr(p, string(name))
		if err != nil {
			return nil, err
		}
		if ok {
			xs = append(xs, cas.Xattr{Name: string(name), Value: v})
		}
	}
	cas.SortXattrs(xs)
	return xs, nil
}

func llistxattr(p string) ([]byte, error) {
	// The list can grow between the size query and the read; retry then.
	for range 8 {
		sz, err := unix.Llistxattr(p, nil)
		if err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				return nil, nil
			}
			return nil, fmt.Errorf("list xattrs: %w", err)
		}
		if sz == 0 {
			return nil, nil
		}
		b := make([]byte, sz)
		n, err := unix.Llistxattr(p, b)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs: %w", err)
		}
		return b[:n], nil
	}
	return nil, fmt.Errorf("list xattrs: keeps changing: %w", unix.ERANGE)
}

// lgetxattr reads one value; ok is false when the attribute vanished
// since it was listed.
func lgetxattr(p, name string) (v []byte, ok bool, err error) {
	for range 8 {
		sz, err := unix.Lgetxattr(p, name, nil)
		if errors.Is(err, unix.ENODATA) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("get xattr %s: %w", name, err)
		}
		if sz == 0 {
			return nil, true, nil
		}
		b := make([]byte, sz)
		n, err := unix.Lgetxattr(p, name, b)
		switch {
		case errors.Is(err, unix.ERANGE):
			continue
		case errors.Is(err, unix.ENODATA):
			return nil, false, nil
		case err != nil:
			return nil, false, fmt.Errorf("get xattr %s: %w", name, err)
		}
		return b[:n], true, nil
	}
	return nil, false, fmt.Errorf("get xattr %s: keeps changing: %w", name, unix.ERANGE)
}
