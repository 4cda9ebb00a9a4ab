// Package envdwire is the wire format of E2B's in-sandbox daemon (envd):
// the Connect "process" and "filesystem" messages as hand-written Go
// structs in their protobuf-JSON spelling (lowerCamelCase names, zero
// values omitted, int64 as strings, bytes as standard base64, enums by
// name), and a JSON codec. No protobuf code is generated.
//
// Both sides use it: the client in adapters/workspace/e2b (and its fake
// server) and esfd's E2B front door (package e2b).
package envdwire
