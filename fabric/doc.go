// Package fabric composes esf: it is the only package that knows every
// other one, and every operation of the API is a method of Fabric.
//
// State layout (one daemon per state dir, enforced by a flock on lock):
//
//	<state>/lock      flock held by the open Fabric
//	<state>/cas/      the local object store (cas/local)
//	<state>/tmp/      scratch space of imports; emptied by Open
//	<state>/journal/  the state plane
//	<state>/mnt/      the FUSE projection
//	<state>/attempts/<attempt>/  an attempt's delta (upper/, work/) and
//	                  default mountpoint (root/)
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
// Attempts (attempt.go, seal.go): an activation is one journal commit with
// its overlay mounted while that commit flushes; a seal of an attempt with
// no executor is one commit too (quiesce, seal and release in one batch).
// Ended attempts' directories are deleted off the request path.
//
// Concurrency: a Fabric is safe for concurrent use. Operations on content
// are independent (the store is content-addressed and each import or export
// works on its own state). Mounts and unmounts of one mount point are
// serialised (lockMount), of different ones not; sealMu
// guards the set of attempts being sealed (a seal's claim, which keeps a
// second seal and a release off them). The goroutines Fabric owns live from
// Open to Close, which waits for each: the initial tally walk (cancelled),
// the starts of queued attempts, and the reaper that deletes ended
// attempts' directories (drained). An activation's early mount runs on a
// goroutine the activation waits for.
package fabric
