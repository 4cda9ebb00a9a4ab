// Package osfake is an offline OpenSandbox: one httptest server playing the
// lifecycle API (/v1/sandboxes...) and, behind the server-proxy route
// (/sandboxes/{id}/proxy/44772/...), each sandbox's execd. It behaves like
// the real services (Docker runtime, execd as of alibaba/OpenSandbox
// 4db3a993) where a client depends on them: status codes and error bodies
// ({"code","message"}; execd's auth failure as {"error"}; FastAPI's 422
// {"detail"}), 202 for create/pause/resume and 204 for delete, asynchronous
// Pending -> Running, Pausing -> Paused and Resuming -> Running, 409 for a
// pause that is not from Running or a resume not from Paused, 404 for a
// missing sandbox, execd's bare-JSON event stream with one event per output
// line, its exit-code convention (error event, evalue = exit code, -1 and
// "signal: <name>" for a signal), and its path expansion ($VAR and "~").
// Rate limiting is injected (RateLimit): 429 with Retry-After.
//
// Sandboxes are directories. Each has a root on the host that is its "/";
// execd's file API maps every path under it (".." cannot leave it).
// Commands run for real with "sh -c", each in its own process group,
// chrooted into the root by a re-executed helper (see isolate_linux.go) in
// a private mount namespace where the host's /usr, /etc, /dev and /proc are
// bound read-only (/bin, /lib... copied as the host's symlinks), so commands
// and the file API agree on every path, HOME is the sandbox's home and
// nothing is mounted in the host's namespace. The bind mounts are visible
// only to commands: the file API sees empty mount points. Options.Unisolated
// runs commands on the host instead, with the working directory, HOME and
// TMPDIR mapped into the root (absolute paths then name host paths). This is
// a test double, not an isolation boundary. Linux only.
//
// Fidelity where it matters for leaks: a command outlives its client, as in
// execd (only DELETE /command, its timeout, or deleting the sandbox ends it),
// and pausing freezes a sandbox's processes (SIGSTOP) and its execd (calls
// hang until it runs again, or fail with 500 after FrozenTimeout as the
// lifecycle proxy's read timeout does). Live and RunningCommands count what
// a client left behind.
//
// Not served: snapshots, metadata patch, renew-expiration, code contexts,
// bash sessions, PTY, metrics, egress. Endpoint lookups always answer with
// the server-proxy shape. Uploads are spooled and placed whole (as execd's
// parsed multipart form is); downloads honour Range via http.ServeContent.
//
// Concurrency: one mutex guards the sandbox table; Close kills every
// process, waits for every goroutine the server started, and removes the
// directory it created.
package osfake
