// Package ingest imports content into the store: a directory (Dir), a tar
// stream, plain, gzip or zstd (Tar, ApplyTar), or an OCI image, as a layout
// directory (OCILayout) or an archive from an OCI tar or `docker save`
// (OCIArchive). Path picks one by looking at its argument. Each returns the
// root id of a tree built with cas.Builder, plus counts.
//
// Invariants:
//   - One content, one root: a directory and a tar of it made by
//     `tar --format=posix --xattrs --xattrs-include='*' --numeric-owner -C DIR -cf - .`
//     import to the same root id. Both store symlink modes as 0777 (Linux
//     ignores them; tar writers disagree), ignore atime and ctime, and
//     name hard-link groups the Builder's way, which is independent of the
//     order entries arrive in. POSIX ACLs are the binary
//     system.posix_acl_* xattrs on both sides (that command stores them
//     so); the text records of GNU tar's --acls (SCHILY.acl.*) are not
//     converted.
//     Sparse files need --sparse as well: Tar takes the holes of a member
//     the archive stores sparse (GNU's old format or its PAX records) from
//     the archive itself, at 4 KiB granularity (a block the tar reader
//     fills without reading the archive is a hole); a dense member is
//     dense, however many zeros it holds.
//   - Re-importing writes nothing: Dir hashes every file before it asks
//     the store (Has) and only then Puts; trees go through the same check.
//     Tar streams can only do that for members up to 1 MiB (buffered);
//     larger ones stream into Put, which keeps the stored copy. Hashing
//     first reads and hashes new large files twice, so once a large file
//     proved new, Dir streams the next ones into Put in one pass until one
//     proves stored (a discarded temp file, never a rewritten object);
//     Upper and Options.NewContent start in that mode.
//   - New objects go through cas batches (cas.NewBatch), committed every
//     few thousand objects, few hundred MiB or two seconds and at the end,
//     so the disk store pays one syncfs per batch instead of one fsync per
//     object. A root is returned only once everything it names is
//     committed; a failed import aborts its open batch.
//   - Nothing escapes the root: tar names are cleaned and a ".." above the
//     root is ErrInvalidArgument, never clamped. Dir never follows a
//     symlink below its root and opens files with O_NOFOLLOW, checking
//     the inode it read is the one it stat'ed.
//   - Malformed input is ErrInvalidArgument; a blob or layer that fails its
//     digest is ErrCorrupt; a failing input reader's error comes back as
//     is. Random bytes never panic (FuzzTar).
//   - Sockets (and tar entry types without a tree form) are skipped, logged
//     as warnings and listed in Stats.Skipped.
//   - Holes: Dir and Upper record a sparse file's holes as its filesystem
//     reports them (SEEK_HOLE/SEEK_DATA, asked only of files that take
//     fewer blocks than their size), so a seal keeps what the attempt
//     showed. The blob holds every byte either way. Every byte read from a
//     hole must be zero, or the file changed while it was read and its
//     holes are dropped: a tree never claims a hole where its blob holds
//     data.
//
// Dir crosses mount points: it imports what a reader of the path sees, as
// tar does by default, and groups hard links by device and inode.
//
// Concurrency: Dir runs one walker goroutine (readdir only, one directory
// open at a time), Options.Workers workers (lstat, xattrs, hashing, Has,
// Put; each holds one 1 MiB buffer) and stages results on the caller's
// goroutine, the only one touching the Builder. Tar reads and stages in
// order on the caller's goroutine (later entries replace earlier ones,
// links need their target) and hands small members to a pool that stores
// them, so store latency overlaps with reading. Every goroutine is joined
// before the call returns; cancellation stops reads and queues promptly.
//
// OCI images go through containerd's libraries: core/images resolves the
// manifest for the platform, core/images/archive unpacks archives into a
// scratch plugins/content/local store, pkg/archive/compression opens the
// layers, which ApplyTar applies in order with whiteouts onto one Builder.
// containerd's readers do not verify content, so this package does:
// metadata blobs before they are parsed, layers (digest and diff id) as
// they stream.
package ingest
