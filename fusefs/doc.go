// Package fusefs projects sealed trees from the content store as one
// read-only FUSE file system.
//
// The mount shows roots/<root_id>/ for any tree in the store: nothing is
// listed under roots/, but a lookup of a root id that names a stored tree
// succeeds. Everything below is lazy: a lookup decodes only the tree objects
// on its path, and no blob is touched until a file is opened. Because a root
// id names immutable content, entry and attribute timeouts are long, negative
// lookups are cached too, and nothing is ever invalidated. For the same
// reason directories are opened with FOPEN_CACHE_DIR: the kernel keeps a
// listing it has read, and a later readdir costs an OPENDIR round trip
// instead of a READDIRPLUS that re-sends every entry.
//
// Interrupts: the kernel interrupts a request whenever the calling thread
// gets a signal (a Go program's preemption signal is enough). Reading a
// tree or verifying a blob is finished anyway rather than failed with
// EINTR, which lstat(2) and open(2) return to their caller as is; only a
// missing or corrupt tree fails its directory for good.
//
// Identity: inode numbers are stable, derived from the root id and the path
// inside it, so a remount shows the same numbers. The members of a hard-link
// group share one inode (derived from the group's name) and report the
// group's link count.
//
// Content: when the store can name a local file for a blob (PathStore), an
// open hands the kernel that file as a passthrough backing fd (Linux >= 6.9,
// root), so reads bypass this process; otherwise reads are served with pread.
// A blob is verified against its id before an open serves it, whenever its
// content may come from disk into the cache it is served from: on the
// first open, when the blob file changed since it was last hashed (device,
// inode, size, mtime, ctime), and when not all of it is in the page cache
// (cachestat(2)). A wholly cached, unchanged file holds what was hashed.
// A blob that does not match fails the open with EIO, is counted
// (Counters.CorruptBlobs, the daemon's esf_cas_corrupt_blobs_total) and
// reported to Options.OnCorrupt (the daemon's cas.corrupt event): damage is
// never content. What passthrough cannot offer: a descriptor already open
// reads the file directly, so damage after an open reaches that open's
// reads until the next open (a store without file paths is hashed through
// Get on every open).
//
// Fidelity: a projected file shows what the same file shows on a disk
// filesystem. Modes are shown as stored, 0000 included (go-fuse's
// NullPermissions); the kernel checks permission bits and POSIX ACLs
// (default_permissions and FUSE_POSIX_ACL: it reads system.posix_acl_*
// through getxattr); st_blocks counts the 4 KiB blocks that hold data, and
// SEEK_DATA/SEEK_HOLE answer from the holes the tree records, which is
// what lets overlayfs copy a sparse file up sparse. A file whose recorded
// holes hold data in its blob fails its open with EIO.
//
// The package knows the content store and nothing of the journal. The server
// must run in a process that never touches its own mount (go-fuse documents
// deadlocks otherwise); esfd starts it as a child process.
package fusefs
