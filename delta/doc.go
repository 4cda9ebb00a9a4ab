// Package delta owns an attempt's private writable layer: an overlayfs
// mount whose lower layer is a projected root (fusefs) and whose upper and
// work directories belong to the attempt alone, and the seal that turns the
// upper directory back into a tree.
//
// Overlay features that would put state outside the upper directory or
// encode it in ways seal cannot read are switched off: no redirect_dir, no
// index, no metacopy (a copied-up file is whole in the upper dir), no xino.
// The cost of redirect_dir=off: rename(2) of a directory that exists in the
// lower layer fails with EXDEV, as across file systems, and tools fall back
// to copy and delete (mv does); files and new directories rename normally. What the upper dir
// holds is then exactly the change: new and copied-up files, whiteouts
// (0:0 character devices), opaque directories (trusted.overlay.opaque=y) and
// directories whose metadata changed.
//
// Nothing here touches the journal: fabric records attempts, delta only
// mounts, unmounts and seals directories.
package delta
