package ingest

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
)

// Upper applies an overlayfs upper directory to the tree base and returns
// the new root: the seal of an attempt. Only the upper directory is read,
// and only trees along changed paths are written, so the cost follows the
// change, not the workspace.
//
// The upper directory is read as overlayfs writes it with redirect_dir,
// index and metacopy off: a 0:0 character device is a whiteout (the path is
// deleted), a directory with trusted.overlay.opaque=y hides everything the
// base had below it, any other entry replaces the base's (a directory's
// attributes replace the base directory's, its children merge), and
// overlay's own trusted.overlay.* attributes are not content. The upper
// root's attributes become the root's (the attempt's root shows them).
func Upper(ctx context.Context, st Store, base cas.ID, upper string, opts Options) (Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Result{}, err
	}
	root, err := filepath.Abs(upper)
	if err != nil {
		return Result{}, err
	}
	var rst unix.Stat_t
	if err := unix.Lstat(root, &rst); err != nil {
		return Result{}, fsError("seal", "/", err) // the host's upper dir is no one's business
	}
	if rst.Mode&unix.S_IFMT != unix.S_IFDIR {
		return Result{}, fmt.Errorf("seal /: the upper directory is not a directory: %w", cas.ErrInvalidArgument)
	}
	return importDir(ctx, st, root, base, true, "upper", upper, opts)
}

// overlayPrefix names the xattrs overlayfs keeps for itself (as root; the
// userxattr mount option would use user.overlay., which we never set).
const overlayPrefix = "trusted.overlay."

// overlayXattrs drops overlay's own attributes and reports whether they
// marked the directory opaque.
func overlayXattrs(xs []cas.Xattr) ([]cas.Xattr, bool) {
	opaque := false
	out := xs[:0]
	for _, x := range xs {
		if strings.HasPrefix(x.Name, overlayPrefix) {
			if x.Name == overlayPrefix+"opaque" && string(x.Value) == "y" {
				opaque = true
			}
			continue
		}
		out = append(out, x)
	}
	if len(out) == 0 {
		out = nil
	}
	return out, opaque
}

// stageOverlay applies an upper directory's entries parents first, so a
// whiteout or an opaque directory acts on the base before the upper's own
// entries below it are staged.
func (d *dirImport) stageOverlay(ctx context.Context, b *cas.Builder, pending []dirResult, firsts map[string]cas.Entry, s *Stats) error {
	// '/' sorts before every other byte, so a directory precedes its
	// children and "a/b" precedes "a-b".
	key := func(p string) string { return strings.ReplaceAll(p, "/", "\x00") }
	slices.SortFunc(pending, func(x, y dirResult) int { return strings.Compare(key(x.rel), key(y.rel)) })
	for _, r := range pending {
		if r.whiteout {
			if err := b.Delete(ctx, r.rel); err != nil {
				return fmt.Errorf("seal %s: whiteout: %w", d.show(r.rel), err)
			}
			continue
		}
		if err := b.Put(ctx, r.rel, r.entry, r.key); err != nil {
			return fmt.Errorf("seal %s: %w", d.show(r.rel), err)
		}
		if r.opaque {
			if err := b.Clear(ctx, r.rel); err != nil {
				return fmt.Errorf("seal %s: opaque: %w", d.show(r.rel), err)
			}
		}
		s.count(r.entry.Type)
		s.Bytes += r.bytes
		if r.key != "" {
			firsts[r.key] = r.entry
		}
	}
	return nil
}
