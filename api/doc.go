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
// names the daemon's span.
//
// Streams: GET /v1/export/{id}.tar streams a tar. Errors before its first
// byte are ordinary JSON errors; once streaming, a failure ends the stream
// early with the trailers Esf-Status: error and Esf-Error: {"code",...}.
// Only Esf-Status: ok marks a complete tar; Client.ExportTar checks it.
// POST /v1/import with a tar Content-Type streams the request body into
// the importer without buffering it.
//
// Socket: Listen creates it with mode 0600 by binding inside a private 0700
// directory and renaming it into place, so no other user can ever connect,
// whatever the umask; it replaces a stale socket and refuses a live one.
//
// Shutdown: Server.Serve stops on its context, lets in-flight requests
// finish for a grace period, then cancels them; closing the listener
// removes the socket file.
//
// The client returns only *errdefs.Error, so errors.Is(err,
// errdefs.ErrNotFound) holds on both sides; a daemon that cannot be reached
// is unavailable.
package api
