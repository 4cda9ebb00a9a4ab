// Package journal is esf's durable state plane: the SandboxGroup, SandboxNode,
// ExecutionAttempt, Evaluation and Lease records of the spec, idempotency
// entries, and an append-only event log, on a small transactional key-value
// seam (Store) that pebble (embedded) and etcd (shared by several workers)
// implement.
//
// # The seam
//
// Store has four methods: View (a consistent snapshot), Update (a
// serialisable read-write transaction that commits atomically and durably,
// or not at all), Notify (a wake-up after commits that appended events) and
// Close. A transaction reads with Get/Scan, writes with Put/Delete and
// appends events with AppendEvent. It is "transactional KV with OCC" rather
// than one method per record, so a second backend implements twelve small
// methods, not the whole record vocabulary. Implementations: journal/pebble
// (embedded, fsync per commit), journal/etcd (an etcd v3 cluster, optimistic
// transactions), journal/mem (fake); all pass journaltest.
//
// Why the event log is part of the seam rather than keys written with Put:
// each backend allocates sequence numbers its own way (pebble and mem keep a
// counter key under the store's single writer; etcd numbers pending events
// by their commit revision, so appending never makes transactions
// conflict), and Notify must know when an append committed. So an event's
// Seq is assigned at commit (AppendEvent does not return it). Reading stays
// uniform: Events and LastSeq on every Reader.
//
// Why Reader.Now: one timestamp per transaction, from the store's injected
// clock, stamps every record and event the transaction writes, so created_at
// and event times of one operation agree and tests control time in one place.
//
// # Records and indexes
//
// Records are JSON values (field names are the spec's) under readable keys,
// and every relation is an empty index key (keys.go lists the layout). The
// typed helpers (GetNode, CreateNode, UpdateNode, ChildrenOf, ...) validate a
// record, check the references it makes, enforce the state machines and the
// immutable fields, and write the record's index keys in the same transaction,
// so an index never names an absent record and a record never lacks its index
// keys. Single operations touch only the keys they name: fork is O(1) in the
// size of the graph (a few small reads and writes per child); listing a group
// is one prefix scan; nothing loads a whole group.
//
// Stored bytes are decoded strictly (unknown fields, trailing data or invalid
// values are ErrCorrupt) and the schema version is recorded when a store is
// first opened, so a newer layout is refused (ErrUnsupported) rather than
// misread.
//
// Ids are "<kind>_" plus 26 base32 digits of 48-bit milliseconds and 80
// random bits (NewID, IDGen): they sort by creation time, so index scans
// list children, attempts and evaluations oldest first.
//
// # State machines
//
// Node: draft → sealed → terminal, and any of them → pruned (final).
// Attempt: queued → active → quiescing → sealed → released, with failed
// reachable from every live state, quiescing → active for a seal that keeps
// the attempt running, and queued/active → released for cancel/discard.
// state.go documents why; testdata/transitions.golden pins every pair.
// Node.Transition and Attempt.Transition move a record in memory;
// UpdateNode and UpdateAttempt refuse, against the stored record, any status
// change the machine forbids (ErrFailedPrecondition), whoever calls them.
//
// # Idempotency
//
// DoIdempotent(ctx, store, key, op, request, fn) runs the check of the key,
// the operation and the recording of its result in one Update: a replay with
// the same op and canonical request returns the stored result bytes
// unchanged and writes nothing; the same key with another request is
// ErrConflict; an operation that fails records nothing. Operations that need
// their own Update use CheckIdempotency and RecordResult inside it.
// A result is recorded whole up to MaxResultSize: in the entry up to
// InlineResultSize, beyond that in parts under idem-part/ with a digest in
// the entry, so no stored value exceeds MaxValueSize; a replay whose parts
// are missing or do not match is ErrCorrupt, never a different result.
//
// # What fabric does on top
//
// An operation is one Update (or one DoIdempotent): read what it needs,
// check its preconditions (expected generation → ErrStaleGeneration, fencing
// token, status), write records with the helpers, append one event per
// transition (Event helpers on each record fill the correlation ids; the
// operation adds trace ids and data), and return its result. Because fn may
// run more than once on an OCC backend, it must not have side effects outside
// the transaction that are unsafe to repeat (CAS puts are safe: content
// addressed and idempotent). Events are read with Events and Follow, outside
// transactions, in pages.
//
// # Crash safety and failpoints
//
// Every Update of every Store evaluates the failpoints
// journal.update.{begin,before-commit,after-commit} through its options' hook
// (journal/failpoint.Inject by default, armed by ESF_FAILPOINTS in a child
// process). Operations add their own with failpoint.Declare/Inject. Because
// an operation's every write goes through one Update, a crash anywhere leaves
// it absent or complete, never partial; journal/pebble's crash tests prove
// the store side with pebble's crashable in-memory filesystem and with a
// process killed by SIGKILL.
//
// # Concurrency
//
// Stores are safe for concurrent use; a Reader or Tx belongs to the goroutine
// that runs its fn and is invalid after fn returns (ErrFailedPrecondition).
// Do not nest View or Update inside fn.
package journal
