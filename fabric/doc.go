// Package fabric composes esf: it is the only package that knows every
// other one, and every operation of the API is a method of Fabric.
//
// State layout (one daemon per state dir, enforced by a flock on lock):
//
//	<state>/lock      flock held by the open Fabric
//	<state>/cas/      the local object store (cas/local)
//	<state>/tmp/      scratch space of imports; emptied by Open
//	<state>/journal/  the state plane (later)
//	<state>/mnt/      the FUSE projection (later)
//
// Every operation goes through Fabric.store, a decorator of the local store
// that keeps the object count and bytes of Status current: one walk in the
// background from Open (Status waits for it), then Put and Delete update the
// tally. Nothing else may write the store behind it.
//
// Ids: operations that take "an id" resolve it with resolveRoot, which today
// accepts a root id (hex) of a stored tree and later node ids too.
//
// Requests carry a CallInfo in their context (idempotency key, W3C trace
// ids), put there by the API; operations read it with CallInfoFrom.
//
// Concurrency: a Fabric is safe for concurrent use. Operations on content
// are independent (the store is content-addressed and each import or export
// works on its own state); the only goroutine Fabric owns is the initial
// tally walk, which Close cancels and waits for.
package fabric
