// Package pebble is the embedded journal.Store: one pebble database in the
// daemon's state directory.
//
// Transactions. View reads a pebble snapshot. Update holds the store's single
// writer lock (a one-slot semaphore, so waiting honours the context) while it
// runs: it reads and writes through an indexed batch (reads see the
// transaction's own writes, then the database, which no one else can change
// meanwhile: serialisable) and applies the batch. A pebble batch is applied
// atomically and replayed atomically from the WAL, so a crash leaves all of
// an Update or none of it. An Update that wrote nothing does not commit and
// costs no fsync.
//
// Group commit. The batch is applied with pebble.Sync but without waiting
// for the sync (ApplyNoSyncWait), and the writer lock is released before
// the Update waits for it (SyncWait): the next transaction runs while the
// WAL is flushed, and pebble's log writer makes every commit queued
// meanwhile durable with the same fdatasync. N concurrent Updates thus
// cost one flush per flush interval, not N flushes in a row. Update still
// returns only once its batch is durable. What a transaction sees may
// include commits whose sync is still running, so the rule "nothing read is
// lost by a crash" is kept by waiting: commits are numbered in the order
// they were applied, durable is the highest number up to which every sync
// finished, and an Update returns, and a View or an Update that wrote
// nothing starts handing out what it read, only once durable covers every
// commit it could have seen (no wait when nothing is in flight). An
// idempotent replay can therefore never return a result that a crash then
// forgets. A failed WAL sync is sticky: the store refuses every later
// transaction, since what the log holds on disk is then unknown.
//
// Durability is tested by crash_test.go against pebble's crashable
// in-memory vfs (only synced data survives a CrashClone) and by a child
// process killed with SIGKILL at each journal failpoint.
//
// Memory: the block cache defaults to 32 MiB and memtables to 4 MiB (pebble
// keeps up to two in flight), which bounds the store's resident set to tens
// of MiB however large the graph grows; records are small and read by key.
//
// Layout on disk: bloom filters on every level, and values of 4 KiB and more
// (the recorded result of a large fork, a big logical state) in blob files
// that tables reference (pebble's value separation), so a lookup never
// decompresses a large value it does not want and compactions move
// references, not the values. The format is pinned (FormatValueSeparation)
// so a pebble upgrade never rewrites the files unasked.
//
// Concurrency: all methods are safe for concurrent use. Views run in
// parallel with each other and with the writer. Close waits for running
// transactions.
package pebble
