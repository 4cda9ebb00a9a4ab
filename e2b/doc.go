// Package e2b is esfd's E2B-compatible front door (esfd --e2b-addr): E2B's
// control plane and the envd protocol of every sandbox on one HTTP
// handler, so that the unmodified E2B SDKs drive esf. Every E2B operation
// is a fabric call, as for the /v1 API: a sandbox is a runc attempt, its
// timeout the attempt's lease, a command an exec in its container.
// docs/e2b.md says how to point the SDKs here and what differs from E2B's
// service.
//
// Control-plane calls need X-API-KEY, one of the keys of --e2b-keys
// (compared in constant time, the file re-read when it changes); a missing
// or wrong key is 401 with E2B's error body {"code","message"}. envd calls
// name their sandbox in E2b-Sandbox-Id and carry its access token in
// X-Access-Token: a random token per sandbox, checked on every call but
// GET /health.
//
// State: the sandboxes (id, token digests, metadata, the running attempt
// or the paused node) and snapshot names are front-door records in the
// fabric's journal, read back by Restore when esfd starts (state.go); the
// attempts and nodes behind them are the fabric's.
package e2b
