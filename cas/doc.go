// Package cas is esf's content-addressed store: object ids, the Store seam,
// and the canonical encoding of directory trees.
//
// An object is named by the BLAKE3-256 of its bytes. A file is one blob object
// holding its bytes raw (so the FUSE projection can hand the kernel a backing
// fd); a directory is a tree object (see Tree) whose entries name blobs and
// further trees, so a whole workspace is named by one root id. Objects are
// immutable: an id always names the same bytes, which is what lets every cache
// above the store keep them forever.
//
// The Store seam is composed of one-method roles (Getter, Putter, Statter,
// Haser, Walker, Deleter); consumers take the smallest role they need. Every
// implementation passes the suite in cas/castest. cas knows nothing of the
// journal, of mounts or of executors.
//
// Integrity: Put hashes while it writes and never publishes bytes under the
// wrong name. Get returns a reader that hashes what it serves and ends with
// ErrCorrupt instead of io.EOF when the bytes do not match their id, so
// corrupted content is never served as complete. GetVerified reads small
// objects (trees) whole and checks them before anything decodes them.
package cas
