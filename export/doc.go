// Package export materialises a stored tree: into a directory (ToDir), as a
// PAX tar stream (ToTar) or as a tar file written atomically, optionally
// compressed (WriteTarFile). Lookup resolves a path inside a stored tree for
// single-artifact exports.
//
// Safety: ToDir never writes outside dest, whatever the tree holds. Every
// name passes cas.ValidName (the decoder checks it, and ToDir checks again),
// and every filesystem call is relative to a descriptor of dest or of a
// directory ToDir itself created, opened with O_NOFOLLOW|O_DIRECTORY: mkdirat,
// openat(O_TMPFILE) + linkat, openat(O_CREAT|O_EXCL|O_NOFOLLOW), symlinkat, mknodat, linkat without
// AT_SYMLINK_FOLLOW, fchownat/utimensat with AT_SYMLINK_NOFOLLOW. Nothing is
// ever resolved through a symlink the export created, and an existing name is
// never reused (O_EXCL, mkdirat and renameat2(RENAME_NOREPLACE) all fail on
// it). Symlink targets are written verbatim and never followed.
//
// Hard links: an entry's LinkGroup is used only as the key of its group, never
// as a path to resolve. The first member met in depth-first name order is
// created; later members are linked to wherever that first member was
// created, found again by walking our own directories with O_NOFOLLOW. For a
// whole root the first member met is the one LinkGroup names; for a subtree
// (an artifact) the names still group correctly. Members of one group must
// agree on type and content, or the tree is ErrCorrupt; their attributes
// should agree too, and the first member's win.
//
// Order of operations on each node: content, then owner (fchown clears setuid
// and security.capability), then xattrs, then mode, then mtime last.
// Xattrs go before the mode so that a read-only file or directory can still
// take them when the export does not run as root; chmod leaves xattrs alone
// (a POSIX ACL's mask follows the group bits, which already agree with it).
// A directory is created 0700 and gets its own owner, xattrs, mode and mtime
// only after all of its children (post-order), so that populating it neither
// bumps its mtime nor trips over its final mode. dest itself is made 0700
// while the export runs and takes the root tree's attributes at the end.
//
// Regular files are written as unnamed files in their directory
// (O_TMPFILE), completed (content verified against its id, owner, xattrs,
// mode, mtime) and only then linked to their final name (linkat never
// replaces; by descriptor with AT_EMPTY_PATH, or through the file's /proc
// magic link without CAP_DAC_READ_SEARCH); on any failure the file is
// closed and vanishes. Where the file system has no O_TMPFILE, a file is
// written under a temporary name (".esf-export-N.tmp", O_EXCL) and renamed
// with RENAME_NOREPLACE, its temporary file unlinked on failure. So a file
// never appears under its final name with partial or unverified content; a
// crash can leave a temporary file behind only in the second case. A new
// file is chowned only when its owner is not the exporter's own (the
// export's directories are not setgid while it runs; when dest's group is
// not ours, as a grpid mount would pass on, every file is chowned). A failed export leaves what it
// already completed in dest (it does not delete the caller's directory); the
// caller removes it. Export does not fsync the files it writes into dest.
//
// Xattrs of symlinks, fifos and devices are set with lsetxattr on
// "/proc/self/fd/<dirfd>/<name>": the kernel resolves the magic link to the
// directory we hold open (not by path), then looks up one valid name in it,
// and lsetxattr does not follow that final symlink. Without /proc those
// xattrs are skipped like refused ones. Xattrs the filesystem or
// our privileges refuse (ENOTSUP, EPERM, e.g. user.* on a symlink or
// trusted.* as non-root) and devices that mknod refuses (EPERM without
// CAP_MKNOD) are skipped with a warning (once per xattr name) and counted in
// Stats.Skipped; any
// other failure fails the export. Without root, a later hard-link member
// whose first member sits in a directory without search permission fails
// (EACCES): the link has to reach that directory by name.
//
// Privileged content: a tree may hold what gives privilege to whoever runs
// or opens it on the host (a sandbox's root can make a setuid-root binary,
// a file capability or a block device). Unless Options.PreservePrivileged
// is set, both exports clear the setuid and setgid bits of non-directories
// (a setgid directory only passes its group on), leave out every security.*
// xattr and every character or block device, and count what they dropped
// in Stats.Dropped with the first MaxDroppedPaths paths. FIFOs, sticky bits
// and ownership stay: they give nothing. Dropping is a policy, not a
// failure: the export succeeds.
//
// Tar: ToTar is deterministic for a root: depth-first name order, root first
// as "./", directories as "./a/", numeric ids with empty user and group
// names, PAX mtimes to the nanosecond, xattrs as SCHILY.xattr.* records, no
// atime or ctime, hard links as TypeLink to the first member's name.
//
// Holes: ToDir writes a sparse file's data at its offsets and leaves the
// holes its entry records unwritten (then truncates the file to its size),
// so the file on disk is as sparse as the tree says; a hole whose bytes are
// not all zero in the blob is ErrCorrupt. Tar output is dense: archive/tar
// cannot write GNU sparse members, and extractors read dense members back
// the same bytes.
//
// Content is streamed through one reusable buffer per export; a blob that
// does not match its id (the Getter's reader ends in cas.ErrCorrupt) or its
// entry's size fails the export with ErrCorrupt. With Options.ReadSmall
// (cas/local.ReadSmall) a blob smaller than the buffer is read whole and
// hashed before any of it is written, which fails the same way. The
// exception is
// Options.VerifiedFile: a dense file of at least 1 MiB whose blob the store
// has already verified and not seen change since (cas/local.OpenVerified)
// is copied by ToDir from the store's raw file in the kernel
// (copy_file_range, which shares extents where the file system can: copy on
// write, never an alias of the object), without hashing it again; its size
// must still match the entry's. Descriptors: one per
// directory level plus a few transient ones, so a deep tree needs depth fds.
//
// Concurrency: each call is sequential and uses only its own state; calls may
// run concurrently with each other. Progress is called on the caller's
// goroutine. Cancellation is checked between entries and between buffer
// chunks.
package export
