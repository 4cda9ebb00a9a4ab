// Package mem is an in-memory cas.Store for tests: a mutex-protected map
// that passes cas/castest like the disk store, plus hooks the disk store
// cannot offer cheaply.
//
// Hooks: Stats and Gets count calls, so a consumer's test can prove laziness
// ("no blob is read until the file is opened") or that an operation wrote
// nothing; Corrupt damages a stored object in place; SetFault makes chosen
// operations fail. Nothing here is meant for production use.
//
// Concurrency: safe for concurrent use. Objects are immutable once stored
// (Corrupt replaces the slice rather than writing into it), so readers hold
// no lock while they read, and Walk calls fn without holding the lock, so fn
// may call back into the store.
package mem
