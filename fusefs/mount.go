package fusefs

import (
	"fmt"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Mount serves the projection at dir until the returned server is
// unmounted. The kernel enforces read-only access ("ro") and permission
// bits ("default_permissions"); other users may read ("allow_other"), so a
// container running as another uid sees its tree.
func Mount(dir string, f *FS) (*fuse.Server, error) {
	timeout := f.opts.Timeout
	srv, err := fs.Mount(dir, f, &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:        "esf",
			Name:          "esf",
			Options:       []string{"ro", "default_permissions"},
			AllowOther:    true,
			MaxBackground: 64,
			MaxWrite:      1 << 20,
			MaxReadAhead:  1 << 20,
			DirectMount:   true,
			Debug:         f.opts.Debug,
		},
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &timeout,
		// Inode numbers come from the tree (inoFor), never from go-fuse.
		FirstAutomaticIno: 1 << 63,
	})
	if err != nil {
		return nil, fmt.Errorf("mount projection at %s: %w", dir, err)
	}
	if err := srv.WaitMount(); err != nil {
		srv.Unmount()
		return nil, fmt.Errorf("mount projection at %s: %w", dir, err)
	}
	return srv, nil
}
