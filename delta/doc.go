// Package delta owns an attempt's private writable layer: an overlayfs
// mount whose lower layer is a projected root (fusefs) and whose upper and
// work directories belong to the attempt alone, and the seal that turns the
// upper directory back into a tree.
//
// Overlay features that would put state outside the upper directory or
// encode it in ways seal cannot read are switched off: no redirect_dir, no
// index, no metacopy (a copied-up file is whole in the upper dir).
// xino is off for another reason: the projection's inode numbers use all 64
// bits, so xino could fold only some of them into one st_dev (xino=on logs
// "inode number too big" for the rest, xino=auto stays off); off, a lower
// file keeps the projection's st_ino under a per-layer st_dev, and a
// directory gets a number overlayfs makes up per mount. Seal reads the
// upper directory itself, never through the overlay, so it relies on none
// of these numbers. None of the options changes the cost of a warm stat
// (measured for issue #8, see the README): a cached walk through the
// overlay pays for revalidating the FUSE dentry under each component,
// which overlayfs does for any lower layer with d_revalidate, whatever the
// options.
// The cost of redirect_dir=off: rename(2) of a directory that exists in the
// lower layer fails with EXDEV, as across file systems, and tools fall back
// to copy and delete (mv does); files and new directories rename normally.
// What the upper dir holds is then exactly the change: new and copied-up
// files, whiteouts (0:0 character devices), opaque directories
// (trusted.overlay.opaque=y) and directories whose metadata changed.
//
// Durability: deltas are mounted volatile. Overlayfs then never syncs the
// upper file system: fsync(2) inside an attempt root returns at once, and
// unmounting skips the syncfs(2) that otherwise costs a flush of the whole
// state file system (10x the rest of an unmount here). Nothing is lost that
// was promised: an attempt's unsealed writes are not durable state (FR-03
// is about seals; a crash may fail a live attempt), and a seal reads the
// upper directory through the page cache and makes durable only what it
// writes to the content store. The price is on remount: overlayfs leaves a
// marker in the work directory and refuses to mount it again until the
// marker is gone. Reclaim removes it when the machine has not restarted
// since the delta was mounted (BootID), the only case in which the upper
// directory may be torn; after a restart the delta is discarded.
//
// Nothing here touches the journal: fabric records attempts, delta only
// mounts, unmounts and seals directories.
package delta
