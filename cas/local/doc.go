// Package local is the embedded disk implementation of cas.Store: one
// read-only file per object under
//
//	<dir>/objects/<first 2 hex digits>/<remaining 62 hex digits>
//	<dir>/tmp/                       temp files of Puts in progress
//
// Objects are stored raw, so the FUSE layer can hand the kernel the file at
// Path(id) as a passthrough backing file.
//
// Durability (one protocol, see STYLE.md): Put streams into a temp file in
// <dir>/tmp while hashing, makes it read-only (0444) and fsyncs it, then
// publishes it with a rename that never replaces (renameat2 RENAME_NOREPLACE,
// falling back to link+unlink) and fsyncs the fan-out directory. The mode is
// set before publishing rather than after so that an object is never visible
// writable and its mode is covered by the file's own fsync. A fan-out
// directory is created on first use and its parent fsynced then. Objects that
// fit in one buffer (most files and every tree) are hashed before any temp
// file exists, so storing one that is already present costs a single stat.
//
// Larger objects stream through a pipeline (stream.go): the caller's
// goroutine reads and hashes 512 KiB chunks while one writer goroutine writes
// the previous ones and starts their writeback (sync_file_range
// SYNC_FILE_RANGE_WRITE, which only starts I/O early and leaves any error to
// the fsync or syncfs that follows), so hashing, writing and the disk
// overlap instead of adding up. The writer ends before Put returns, on
// every path. A large object found stored once hashed is not published: its
// temp file is removed without an fsync.
//
// "Put returned" means "durable", including when the object already existed:
// an existing object from an earlier run was made durable by Open (which
// fsyncs every fan-out directory), one that another Put of this process
// has renamed but not yet fsynced is fsynced again by the Put that found it,
// and one a batch linked is durable under its redo record (below).
// Delete does not fsync: an object that reappears after a crash is garbage
// the next collection removes again.
//
// Removals are counted (Deletions, cas.DeletionCounter): the count moves
// before an object is unlinked and again after, for Delete and for Open's
// redo of a damaged logged object (removed and at once written again;
// counted all the same, since in between it is missing). A caller that
// read the count before it saw an object present may, while the count
// has not moved, take the object as still present without a stat
// (ingest.StatCache, whose re-import hits skip the store's Has so). The
// count is this Store's, in memory: it covers removals through it only,
// which is every removal while the daemon holds the store.
//
// Invariants: a file under objects/ always holds bytes whose BLAKE3-256 is its
// name, unless the disk corrupted it or a machine crash lost a logged
// object's unflushed bytes (repaired by the next Open, see below); Get hashes what it serves and ends with
// cas.ErrCorrupt instead of io.EOF in that case. Names under objects/ that
// are not object names are ignored (never listed, never deleted).
//
// Batches (NewBatch) pay the protocol once per batch, with one flush: a
// syncfs(2) of the temp files (named after their objects), then hard links
// into objects/ that are left unflushed. Why one flush is enough: every
// object is durable under its tmp/pub-<id>-... name before any link is made,
// that name stays until a later flush has made the link durable (the next
// batch's syncfs retires it), and Open redoes, before anything reads the
// store, the publication of every pub- file a crash left (linking in those
// whose content hashes to the id they name, removing the rest).
//
// A small batch (at most 64 objects, 1 MiB, each hashed in memory: a seal
// of a few changed files) skips even that syncfs, which writes back every
// dirty page of the file system, anyone's: its objects' bytes are appended
// to the store's redo log (<dir>/redo.log, preallocated) and made durable by
// one fdatasync of it, then linked into place with nothing flushed; Open
// rewrites, from the log and before anything reads the store, every logged
// object a crash left missing or damaged, and a full log is emptied by one
// syncfs (redolog.go). Such a seal waits for two fdatasyncs of small
// appends, the log's and the journal's. So, after a machine crash and
// until Open, a file under objects/ may be damaged; Get detects it
// (ErrCorrupt), and only a store opened without the log's replay (negative
// StaleTempAge: the FUSE server) could meet it before esfd's Open has
// repaired it. With Options.SmallBatch, a batch of at most that many objects
// fsyncs its files and directories in parallel instead, which other
// writers' dirty pages cannot slow down but which costs a flush of the
// disk's cache per fsync (slower on an idle file system; off by default).
//
// A small batch committed with a cas.Deferral in its context (a seal with
// the embedded journal, see fabric/storeredo.go) does not even append to
// the log: it hands its objects' ids and bytes to the Deferral and
// publishes nothing; the caller commits them in its own journal
// transaction (one flush for both), then Publish links them in unflushed,
// as after the log's fdatasync. The caller replays its records with Redo
// (this log's own replay) before anything reads the store, and drops them
// after Sync (one syncfs). Until Publish, nothing of such a batch is
// under objects/, so an object there is either flushed or recorded.
//
// A batch can also adopt a file (cas.Adopter, adopt.go): hash it, make it
// read-only and hard-link it by descriptor as the object's tmp/pub- file,
// after which it is published exactly as a written one (Commit's syncfs
// writes back whatever of it is dirty, the link into objects/ has the same
// redo record). A seal of an attempt released with it stores its large
// files this way, reading each once to hash it instead of copying it; the
// file's owner promises never to write it again (fabric gives a delta whose
// seal did not commit its own copies back before mounting it again). A file
// on another file system is copied.
//
// Temp files: every failed or cancelled Put removes its own. Open removes
// temp files older than Options.StaleTempAge (an hour by default), left by a
// process that died mid-Put. It does not remove them all, because another
// process (the FUSE server) may open the same store while esfd is writing.
//
// Concurrency: a Store is safe for concurrent use by many goroutines and, for
// readers, by other processes. Concurrent Puts of the same object are safe:
// exactly one publishes it (created true), the others see it exists.
package local
