// Package etcd is the journal.Store on an etcd v3 cluster: the state plane
// several esfd workers share. It passes journal/journaltest against 1- and
// 3-member clusters. keys.go lists the key layout; docs/scale-out.md says
// how to run it.
//
// # Transactions
//
// View reads at one revision: its first read is linearizable and fixes
// the revision, later reads ask any member for that revision. Update runs
// fn the same way, buffers its writes, and commits them in one etcd
// transaction whose compares say that nothing fn read has changed since
// its revision (optimistic concurrency): a key read has the mod revision
// it had (0 if absent); a scanned range has no key with a newer mod
// revision, and no newer tombstone. A range compare cannot see a key that
// was deleted, so every delete also writes x/tomb/<key>; tombstones are
// cleared all at once by the maintenance, which rewrites x/tombgc, and
// every transaction that scanned compares tombgc too. If a compare fails,
// fn runs again (after a jittered backoff); a read or commit that fails
// because the cluster has no quorum retries for UnavailableTimeout.
// Guards beyond the compare budget merge into wider ranges, which can
// only add conflicts. A read-only Update commits nothing.
//
// # Lost replies
//
// Every commit also writes x/done/<minute>/<txid> and holds only while
// x/abort/<minute>/<txid> does not exist. When a commit's reply is lost
// (the leader died, the connection broke, the context ended), the writer
// asks: done marker absent? then write the abort marker. After that the
// commit can no longer happen, so the outcome is known exactly, and
// Update reports committed or retries; only a cluster unreachable for the
// whole UnavailableTimeout leaves it unknown (ErrUnavailable). Markers
// older than ten minutes are cleared.
//
// # Large transactions
//
// etcd bounds a request (128 operations, 1.5 MiB by default, each key
// once). An Update beyond that (a fork of 10,000 children, a recorded
// result of 16 MiB, a thousand expired keys) is staged: its writes go in
// chunks under x/stage/<txid>/, invisible; one small transaction with the
// Update's compares publishes x/commit/<txid> (the commit point); then
// each chunk is applied and deleted in a transaction of its own. While a
// commit key exists nobody else commits (every commit compares x/commit/
// empty) and every reader's first read waits for it, or rolls it forward
// itself if its writer stalls: so no reader sees part of it, and a writer
// that dies after publishing leaves it to the next reader. Staged chunks
// of writers that died before publishing are deleted by the maintenance.
//
// # Events
//
// Appending events must not make every Update conflict with every other,
// so no transaction reads or writes a sequence counter: each writes its
// events in chunks under x/evq/<txid>/ (its own keys). The log, at any
// revision, is the indexed events (j/sys/ev/<seq>) followed by the
// pending chunks in the order of their transactions' create revisions
// (commit order), numbered on from j/sys/evseq: gapless, in commit order,
// the same for every reader. A background indexer moves the oldest pending
// chunks into j/sys/ev/ with exactly those numbers (compared against evseq
// and each chunk's revision, so concurrent indexers on several workers
// agree). A transaction's own events get their Seq at commit and are not
// visible to it.
//
// Notify: a commit of this store that appended events wakes waiters at
// once; a watch on x/evq/ wakes them for every other commit of the
// cluster. Followers read the durable log, not the watch: when the watch
// breaks or its revision is compacted away, waiters are woken to re-read
// from where they are, and the watch restarts from now, so a transition
// is never missed.
//
// # Maintenance
//
// Every CompactEvery (5 minutes) each store compacts etcd's history to the
// revision it saw one round earlier (a View may last that long), clears
// the tombstones, stale staged writes and old outcome markers. Running it
// on several workers at once is harmless.
//
// # Crash safety
//
// The journal failpoints run as in every Store; journal.etcd.roll-forward
// sits between publishing a large transaction and rolling it forward.
// Durability is etcd's: a commit is acknowledged once a majority has it
// in its log on disk.
package etcd
