// Package e2b is the workspace adapter for E2B: a workspace.Provider (with
// workspace.Enumerator) whose sessions (with workspace.Pauser) are E2B
// sandboxes, spoken to over E2B's own wire protocols and no SDK.
//
// Two planes. The control plane is E2B's REST API (create POST /sandboxes,
// GET/DELETE /sandboxes/{id}, pause, connect, timeout, list GET
// /v2/sandboxes), authenticated by the API key. Inside each sandbox, envd
// (package envd) serves commands and files: Connect RPCs for processes and
// the filesystem, plain HTTP for transfers, reached through E2B's edge
// proxy with the sandbox's access and traffic tokens. Everything about
// tenancy and endpoints is Config; workspace.Spec carries only the
// template (Spec.Image), environment, working directory, lifetime and
// metadata.
//
// Mapping onto the contract:
//
//   - Run is /bin/sh -c through process.Start. envd keeps a process whose
//     stream closes, so a Run that ends early (cancel, timeout, write
//     error) sends SIGKILL before returning. Spec.Timeout travels as
//     Connect-Timeout-Ms, on which envd kills the process itself. Stdin
//     needs envd >= 0.5.2 (CloseStdin); older sandboxes answer
//     ErrUnsupported. A signal death is 128+N, read from envd's status.
//   - Paths follow vfs.Resolve with Config.Home and the session's working
//     directory, which is kept in sandbox metadata (MetaWorkDir) so Attach
//     finds it. Glob and Grep walk with List and Read: envd has no search.
//   - Upload streams a multipart body through an io.Pipe into a temporary
//     file beside the target and renames it over the target (envd's own
//     upload writes in place). A failed or cancelled source still ends the
//     body cleanly, so envd is done with the temporary file before it is
//     removed. Replaced files keep their permission bits (a chmod process
//     when they differ, since envd has no chmod RPC).
//   - Create sends a random token in metadata (MetaCreate) and lets its
//     request outlive a cancelled context by Config.CleanupTimeout, so a
//     sandbox the service made is killed by id, or found by token.
//   - Attach is GET (which never resumes) and, for a running sandbox,
//     connect, the only call that hands out the traffic token; connect
//     leaves a running sandbox running. A handle that saw its sandbox
//     paused re-reads the state before answering ErrPaused, since another
//     handle may have resumed it.
//   - Pause retries 409 (pausing, resuming) and confirms "paused" by
//     polling; Resume is connect, retried over 409. Both are idempotent.
//   - Errors: control-plane 401/403/429 are ErrPolicy (429 after bounded
//     retries of idempotent calls, honouring Retry-After, with RetryAfter
//     set), 404 ErrNotFound; envd's Connect codes and /files statuses map
//     to the io/fs classes inside *fs.PathError; when the proxy cannot
//     reach a sandbox (502/503, Connect "unavailable") the control plane
//     tells ErrNotFound from ErrPaused.
//
// The same adapter serves CubeSandbox by configuration (see the
// cubesandbox module): BearerAuth, TrafficTokenHeaders, ProxyAddr, User,
// Name.
//
// Concurrency: Provider and Session are safe for concurrent use. A
// Session's mutable state (closed, paused, the envd client bound to the
// current tokens) sits behind one mutex; every call takes a snapshot and
// works without holding it. Goroutines (stdin feeding, the multipart
// writer, the outlive watcher) end before their call returns.
package e2b
