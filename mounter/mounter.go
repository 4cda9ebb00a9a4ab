// Package mounter is fabric's seam to the file systems an attempt's root
// is made of: the projection that shows every root by id, the writable
// delta (an overlay) of an attempt over one projected root, the walk of
// that delta that a seal stores, and the read-only views of a root.
// Real is today's implementation (FUSE, overlayfs, bind mounts: root
// only); mounter/fake is a plain-directory stand-in for fabric's logic
// tests. Both pass the conformance suite in mounter/mountertest.
package mounter

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/fusefs"
	"github.com/esf-dev/esf/ingest"
)

// Mounter mounts what fabric shows. Paths are absolute. A Mounter is safe
// for concurrent use; fabric serialises the mounts and unmounts of one
// root itself.
type Mounter interface {
	// ServeProjection serves the projection of opts.Store in this process
	// at the existing directory mnt: mnt/roots/<id> shows root id. The
	// projection as a child process (fabric's ProjectionCommand) is the
	// real one's only.
	ServeProjection(mnt string, opts fusefs.Options) (Server, error)
	// RootAttr reads a projected root's attributes (delta.ReadRootAttr).
	RootAttr(dir string) (delta.RootAttr, error)
	// Mount mounts the writable root l.Root of a delta over l.Lower (a
	// projected root), keeping what an earlier mount of the same delta
	// wrote (delta.Mount).
	Mount(l delta.Layout) error
	// Reclaim readies a delta unmounted in this boot for Mount again
	// (delta.Reclaim).
	Reclaim(l delta.Layout) error
	// Unmount unmounts a writable root or a view; nothing mounted there
	// is fine, a busy one is cas.ErrFailedPrecondition (delta.Unmount).
	// The delta stays.
	Unmount(dir string) error
	// Detach unmounts dir lazily even if busy (MNT_DETACH).
	Detach(dir string) error
	// Mounted reports whether something is mounted at dir.
	Mounted(dir string) bool
	// UpperInUse reports whether a writable root, anywhere, is mounted
	// over the delta directory dir (Layout.Dir).
	UpperInUse(dir string) bool
	// Seal stores what the delta l holds, mounted or not, as a tree over
	// base, the root it was mounted over (ingest.Upper of the upper
	// directory).
	Seal(ctx context.Context, st ingest.Store, base cas.ID, l delta.Layout, opts ingest.Options) (ingest.Result, error)
	// BindView shows the projected root src read-only (nosuid, nodev) at
	// the existing empty directory dir.
	BindView(src, dir string) error
	// IsView reports whether dir is a view of the projection.
	IsView(dir string) bool
	// Views lists the views of the projection mounted at mnt.
	Views(mnt string) ([]View, error)
}

// Server is a projection served in this process.
type Server interface {
	// Unmount stops serving and unmounts the projection.
	Unmount() error
}

// View is a read-only view of the projection.
type View struct {
	Dir string
	// RootID is the root it shows, if it shows one (a bind of
	// roots/<id> or below).
	RootID cas.ID
}

// Real is the mounter of FUSE, overlayfs and bind mounts (needs root).
type Real struct{}

// New returns the real mounter.
func New() Mounter { return Real{} }

// ServeProjection mounts the FUSE projection in process.
func (Real) ServeProjection(mnt string, opts fusefs.Options) (Server, error) {
	fsys, err := fusefs.New(opts)
	if err != nil {
		return nil, err
	}
	srv, err := fusefs.Mount(mnt, fsys)
	if err != nil {
		return nil, err
	}
	return srv, nil
}

// RootAttr is delta.ReadRootAttr.
func (Real) RootAttr(dir string) (delta.RootAttr, error) { return delta.ReadRootAttr(dir) }

// Mount is delta.Mount.
func (Real) Mount(l delta.Layout) error { return delta.Mount(l) }

// Reclaim is delta.Reclaim.
func (Real) Reclaim(l delta.Layout) error { return delta.Reclaim(l) }

// Unmount is delta.Unmount.
func (Real) Unmount(dir string) error { return delta.Unmount(dir) }

// Detach unmounts with MNT_DETACH.
func (Real) Detach(dir string) error {
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("detach %s: %w", dir, err)
	}
	return nil
}

// Mounted is delta.Mounted.
func (Real) Mounted(dir string) bool { return delta.Mounted(dir) }

// UpperInUse reports whether an overlay is mounted, anywhere, with its
// upper directory in the delta directory dir: mountinfo lists the overlay's
// options, and mountpoints outside the attempt's directory (a custom root)
// are found only there. On a read error it answers yes: a delta kept too
// long is swept by Recover, one deleted under a live mount is lost.
func (Real) UpperInUse(dir string) bool {
	opt := "upperdir=" + delta.Layout{Dir: dir}.Upper()
	idmapped := delta.IDMappedSource(dir)
	infos, err := mountinfo.GetMounts(func(in *mountinfo.Info) (skip, stop bool) {
		if in.FSType != "overlay" {
			return true, false
		}
		if in.Source == idmapped {
			return false, true
		}
		for o := range strings.SplitSeq(in.VFSOptions, ",") {
			if o == opt {
				return false, true
			}
		}
		return true, false
	})
	return err != nil || len(infos) > 0
}

// Seal imports the upper directory over base (ingest.Upper).
func (Real) Seal(ctx context.Context, st ingest.Store, base cas.ID, l delta.Layout, opts ingest.Options) (ingest.Result, error) {
	return ingest.Upper(ctx, st, base, l.Upper(), opts)
}

// BindView bind-mounts src at dir, then makes the bind read-only.
func (Real) BindView(src, dir string) error {
	if err := unix.Mount(src, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	// A bind remount sets the mount's flags to exactly these: nosuid and
	// nodev must be named again or the view loses them, and other users
	// could run a setuid binary or open a device node the tree holds.
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("read-only %s: %w", dir, err)
	}
	return nil
}

// IsView reports whether the projection's file system is mounted at dir.
func (Real) IsView(dir string) bool {
	fstype, ok := fusefs.MountType(dir)
	return ok && fstype == "fuse.esf"
}

// Views reads the binds of the projection from mountinfo, so they are
// found after a restart too, as the mounts outlive it.
func (Real) Views(mnt string) ([]View, error) {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return nil, err
	}
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, fmt.Errorf("read-only mounts: %w", err)
	}
	major, minor, found := 0, 0, false
	for _, in := range infos {
		if in.Mountpoint == abs {
			major, minor, found = in.Major, in.Minor, true
		}
	}
	if !found {
		return nil, nil
	}
	var out []View
	for _, in := range infos {
		if in.Major != major || in.Minor != minor || in.Mountpoint == abs {
			continue
		}
		v := View{Dir: in.Mountpoint}
		if rest, ok := strings.CutPrefix(in.Root, "/roots/"); ok {
			hex, _, _ := strings.Cut(rest, "/")
			v.RootID, _ = cas.ParseID(hex)
		}
		out = append(out, v)
	}
	return out, nil
}
