// Package fusefs projects sealed trees from the content store as one
// read-only FUSE file system.
//
// The mount shows roots/<root_id>/ for any tree in the store: nothing is
// listed under roots/, but a lookup of a root id that names a stored tree
// succeeds. Everything below is lazy: a lookup decodes only the tree objects
// on its path, and no blob is touched until a file is opened. Because a root
// id names immutable content, entry and attribute timeouts are long, negative
// lookups are cached too, and nothing is ever invalidated.
//
// Identity: inode numbers are stable, derived from the root id and the path
// inside it, so a remount shows the same numbers. The members of a hard-link
// group share one inode (derived from the group's name) and report the
// group's link count.
//
// Content: when the store can name a local file for a blob (PathStore), an
// open hands the kernel that file as a passthrough backing fd (Linux >= 6.9,
// root), so reads bypass this process; otherwise reads are served with pread.
// A blob is verified against its id once per process, on its first open,
// before any byte is served: a corrupted object fails the open with EIO.
//
// The package knows the content store and nothing of the journal. The server
// must run in a process that never touches its own mount (go-fuse documents
// deadlocks otherwise); esfd starts it as a child process.
package fusefs
