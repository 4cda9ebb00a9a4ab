package fusefs

import (
	"fmt"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Mount serves the projection at dir until the returned server is
// unmounted. The kernel enforces read-only access ("ro"), permission bits
// ("default_permissions") and POSIX ACLs (FUSE_POSIX_ACL, which asks the
// kernel to read system.posix_acl_* through getxattr and check them as on
// any disk filesystem); other users may read ("allow_other"), so a
// container running as another uid sees its tree. Because others may read
// it, it is "nosuid,nodev": a setuid binary or a device node a tree holds
// gives nothing to whoever runs or opens it through the projection (an
// attempt's overlay on top has its own mount flags).
func Mount(dir string, f *FS) (*fuse.Server, error) {
	timeout := f.opts.Timeout
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:        "esf",
			Name:          "esf",
			Options:       []string{"ro", "default_permissions", "nosuid", "nodev"},
			AllowOther:    true,
			MaxBackground: 64,
			MaxWrite:      1 << 20,
			MaxReadAhead:  1 << 20,
			DirectMount:   true,
			EnableAcl:     true,
			// Runc attempts in a user namespace see the projection through
			// an idmapped clone (delta.IDMap); the kernel allows that only
			// when the server says so.
			IDMappedMount: true,
			// READDIRPLUS only where it pays, as libfuse does by default:
			// the kernel asks for attributes with the first batch of a
			// listing and with later ones only once a child's attributes
			// were looked up (ls -l, find -type f). Without it every
			// listing made an inode here for every entry: a million of
			// them for one ls -f of a huge directory.
			ExtraCapabilities: fuse.CAP_READDIRPLUS_AUTO,
			Debug:             f.opts.Debug,
		},
		// Mode 0000 is a mode: without this go-fuse shows it as 0644 or
		// 0755, and a 0000 /etc/shadow becomes readable by everyone.
		NullPermissions: true,
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &timeout,
		// Inode numbers come from the tree (inoFor), never from go-fuse.
		FirstAutomaticIno: 1 << 63,
	}
	// fs.Mount, with the bridge behind handlelessDirs.
	raw := &handlelessDirs{RawFileSystem: fs.NewNodeFS(f, opts), fsys: f}
	srv, err := fuse.NewServer(raw, dir, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mount projection at %s: %w", dir, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		srv.Unmount()
		return nil, fmt.Errorf("mount projection at %s: %w", dir, err)
	}
	return srv, nil
}
