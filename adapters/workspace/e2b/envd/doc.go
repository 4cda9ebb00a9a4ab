// Package envd speaks to E2B's in-sandbox daemon (envd), which CubeSandbox
// also runs unchanged: the Connect "process" and "filesystem" services and
// the plain-HTTP /files transfer API.
//
// The Connect services are driven with connectrpc.com/connect and a JSON
// codec over hand-written Go structs that mirror envd's protobuf messages in
// their protobuf-JSON spelling (lowerCamelCase names, zero values omitted,
// int64 as strings, bytes as standard base64, enums by name). No protobuf
// code is generated: connect-go only needs a Codec, so the same structs and
// codec serve the client here and the fake server in e2bfake.
//
// A Client is bound to one sandbox (a Target: base URL, optional virtual
// host, the headers the edge proxy and envd check, and the user). It keeps
// no per-call state and is safe for concurrent use; callers build a new one
// when the sandbox's tokens change (after a resume).
//
// Errors are returned as the protocol reports them: *connect.Error for the
// Connect services (end-of-stream errors included) and *HTTPError for /files.
// Mapping them to workspace classes is the caller's business.
package envd
