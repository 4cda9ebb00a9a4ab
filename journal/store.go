package journal

import (
	"context"
	"time"
)

// Store is the durable state plane: a transactional key-value store with an
// append-only event log. The embedded implementation is journal/pebble, the
// shared one (several workers on one graph) journal/etcd, and a fake is
// journal/mem; all pass journal/journaltest. The etcd store maps View to
// reads at one revision, Update to a transaction guarded by mod-revision
// compares of what it read, retried on conflict, and Notify to a watch.
//
// Records, indexes, idempotency and the event vocabulary are layered on top
// of this interface in package journal, so every implementation stores the
// same bytes under the same keys (see keys.go) except for the event log,
// whose layout each implementation owns.
type Store interface {
	// View runs fn against a consistent, read-only snapshot: every read in fn
	// sees the state after some set of committed Updates and none of any
	// other. fn's error is returned unchanged. The Reader is valid only
	// during fn and only on fn's goroutine.
	View(ctx context.Context, fn func(r Reader) error) error

	// Update runs fn in a read-write transaction. Reads in fn see the
	// committed state plus fn's own writes. If fn returns nil, all of fn's
	// writes and appended events commit in one atomic, durable batch: once
	// Update returns nil, a crash never loses any of them, and no reader
	// ever sees some of them without the rest. If fn returns an error, or
	// ctx ends before the commit, nothing is written and that error
	// (unchanged, so errors.Is/As work) or ctx.Err() is returned.
	//
	// Updates are serialisable: the result is as if they ran one at a time
	// in commit order. An implementation may do that with a writer lock
	// (pebble, mem) or with optimistic checks and retries (etcd); therefore
	// fn may be called more than once, and must have no effect outside tx
	// that is unsafe to repeat, and must not keep values across calls.
	//
	// A non-nil error after the commit point (only an injected
	// "journal.update.after-commit" failpoint, or a failed close of the
	// batch) means the outcome is unknown to the caller, like a lost reply:
	// idempotency keys make the retry safe.
	//
	// Do not call View or Update from inside fn (the store may deadlock).
	Update(ctx context.Context, fn func(tx Tx) error) error

	// Notify returns a channel that is closed when an Update that appended
	// at least one event commits after the call, or when the store closes.
	// Take the channel before reading the log, so no append is missed:
	//
	//	ch := s.Notify(); read events after seq; <-ch; read again ...
	Notify() <-chan struct{}

	// Close waits for running transactions, releases the store and closes
	// every Notify channel. Later calls of any method return ErrClosed;
	// closing twice is nil.
	Close() error
}

// Reader reads keys and the event log. Keys are compared bytewise.
type Reader interface {
	// Get returns a copy of the value of key, or an error wrapping
	// ErrNotFound.
	Get(key []byte) ([]byte, error)

	// Scan calls fn for each key in [start, end) in ascending order (end nil
	// means no upper bound), on the caller's goroutine. key and value are
	// valid only during the call: copy them to keep them. An error from fn
	// stops the scan and is returned, except ErrStop, which ends it with
	// nil. Inside an Update, a Scan sees the writes made before it started,
	// not those fn makes while it runs. Long scans return ctx.Err() once the
	// transaction's context ends.
	Scan(start, end []byte, fn func(key, value []byte) error) error

	// Events calls fn for each committed event with Seq > after, in Seq
	// order, with the same stopping rules as Scan. Inside an Update it
	// reads the log as of the transaction's snapshot (not its own appends).
	Events(after uint64, fn func(ev Event) error) error

	// LastSeq is the Seq of the newest committed event this reader sees,
	// 0 if none.
	LastSeq() (uint64, error)

	// Now is the store's clock read once when the transaction began: every
	// record and event one Update writes shares this timestamp.
	Now() time.Time
}

// Tx is the read-write view of an Update. Values passed to Put are copied.
type Tx interface {
	Reader

	// Put sets key to value. Keys are 1..MaxKeySize bytes and may not start
	// with ReservedPrefix (the store's own records); values are at most
	// MaxValueSize bytes. Violations wrap ErrInvalidArgument.
	Put(key, value []byte) error

	// Delete removes key; deleting a missing key is not an error.
	Delete(key []byte) error

	// AppendEvent appends ev to the event log in this transaction. The
	// event gets its Seq when the transaction commits: one more than the
	// event before it in commit order, so committed Seqs are gapless and
	// in commit order. ev.Seq is ignored; a zero ev.Time becomes Now().
	// The event is visible to others only if the Update commits, and not
	// to this transaction's own Events and LastSeq (they read the
	// committed log).
	//
	// Why the Seq is not returned: a store that commits optimistically
	// (etcd) learns an event's place in the log only at or after its
	// commit, and having every Update that appends read and write one
	// sequence counter would make all of them conflict with each other.
	AppendEvent(ev Event) error
}

// Limits every Store enforces, chosen so an etcd implementation (1.5 MiB
// request limit by default) can hold any record the pebble one accepts.
const (
	MaxKeySize   = 1024
	MaxValueSize = 1 << 20
)

// ReservedPrefix starts the keys a Store keeps for itself (event log, schema
// version). Reading them with Scan is allowed; writing them is not.
const ReservedPrefix = "sys/"

// SchemaVersion is the version of the key layout and record encoding. A store
// records it when first opened and refuses (ErrUnsupported) to open a store
// written with another one.
const SchemaVersion = 1
