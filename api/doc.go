// Package api is esfd's HTTP/JSON interface under /v1/ on a unix socket,
// and the Go client esfctl uses. docs/openapi.yaml is its reference.
//
// The server translates and nothing else: it decodes a request strictly
// (unknown fields, trailing data and JSON bodies over 1 MiB are
// invalid_argument), calls one fabric.Fabric method and encodes the result.
// Every error leaves as {"code","message"} with the stable codes of errdefs;
// statusOf in errors.go is the one table from codes to HTTP statuses, and
// clients switch on the code, never the status (conflict and
// stale_generation share 409).
//
// Request context: each request carries a fabric.CallInfo with its
// Idempotency-Key (mutations) and W3C trace ids. A valid traceparent is
// continued, anything else starts a new trace; the response's traceparent
// names the daemon's span. A mutation sent without a key gets one made up
// here ("api-..."), and every mutation's response names its key in the
// Idempotency-Key header, so any caller can retry a lost reply.
//
// Graph and attempt endpoints (groups, fork, inspect, tree, promote,
// evidence, evaluate, prune, activate, suspend, release, retry, renew,
// mount, umount) take and return the fabric types as they are: their JSON
// tags are the spec's names. jsonOp wires most of them: decode strictly,
// call one Fabric method, encode. POST /v1/groups with only a source imports
// it first.
//
// Streams: GET /v1/export/{id}.tar streams a tar. Errors before its first
// byte are ordinary JSON errors; once streaming, a failure ends the stream
// early with the trailers Esf-Status: error and Esf-Error: {"code",...}.
// Only Esf-Status: ok marks a complete tar; Client.ExportTar checks it.
// POST /v1/import with a tar Content-Type streams the request body into
// the importer without buffering it; so does POST /v1/evidence (any bytes).
// GET /v1/events streams JSON lines with the same trailers: Esf-Status ok
// when a listing reached the end of the log. With follow=1 the handler
// waits for new events (journal.Follow, no polling) and flushes each line;
// it ends when the client goes away (its request context) or, with an
// unavailable error in the trailers, when Serve begins to shut down, so a
// follower never holds shutdown for the grace period.
//
// GET /v1/patch streams a git patch with the same trailers. POST /v1/exec
// streams frames ([id][u32 length][payload]; 1 stdout, 2 stderr, 3 exit,
// last) written and flushed as the command produces output; the request
// context is the command's, so a client that leaves kills it. With stdin or
// a terminal the same request becomes full duplex (media type
// application/vnd.esf.exec-stream, exec_stream.go): the client sends the
// request (5), stdin (0, empty = end) and resize (4) frames in the body, and
// the server adds stdin acknowledgements (6) that bound what is in flight.
//
// Content endpoints (gc, merge, diff, export-node, provenance,
// verify-provenance) are plain JSON. The one error writer adds "paths" to
// the body of a merge conflict (a treediff.ConflictError anywhere in the
// chain); the client returns it as a *PathsError.
//
// Socket: Listen creates it with mode 0600 by binding inside a private 0700
// directory and renaming it into place, so no other user can ever connect,
// whatever the umask; it replaces a stale socket and refuses a live one.
//
// Shutdown: Server.Serve stops on its context, lets in-flight requests
// finish for a grace period, then cancels them; closing the listener
// removes the socket file.
//
// The client returns only *errdefs.Error (a *PathsError wraps one), so errors.Is(err,
// errdefs.ErrNotFound) holds on both sides; a daemon that cannot be reached
// is unavailable.
package api
