// Package daytonafake is an offline Daytona: an httptest server speaking the
// Daytona API (control plane, under URL()) and the toolbox API behind the
// toolbox proxy (under ToolboxURL()/{sandboxId}), faithful where the daytona
// adapter depends on it. It was written from the public OpenAPI documents
// (daytona/clients api.json 1.0, toolbox.json) and from reading the archived
// daytonaio/daytona v0.190.0 API server, proxy, runner and daemon for
// behaviour; no code was copied.
//
// What it reproduces:
//
//   - Auth: Authorization: Bearer <api key>, or <jwt> plus
//     X-Daytona-Organization-ID. Failures are 401 with the NestJS body
//     {"path","timestamp","statusCode","error","message"} on the API and the
//     common-go ErrorResponse {"statusCode","message","code",...} on the
//     toolbox.
//   - Asynchronous lifecycle with Daytona's state and desiredState fields and
//     its guards: create answers 200 in "creating" ("pending_build" for an
//     image) and reaches "started" one Transition later; stop keeps the
//     state and sets desiredState, then stopping -> stopped; start goes
//     starting -> started and is a no-op on a started sandbox; delete is a
//     soft delete (name freed, desiredState "destroyed", then destroying ->
//     destroyed -> 404). A pending sandbox answers 409 "Sandbox state change
//     in progress" to stop/start/delete; stopping a sandbox that is not
//     started is 400; pause is 422 unless SandboxClass is linux-vm/windows.
//   - The toolbox proxy/runner gate: unknown sandbox 401 (the proxy's bearer
//     check fails), destroyed container 404, any state but "started" 400
//     "no IP address found. Is the Sandbox started?".
//   - Daemon file handlers: errors as bare status codes with no body (gin's
//     AbortWithError), os.Stat semantics (symlinks followed, dangling ones
//     dropped from listings), 409 on move onto an existing path, 400 on
//     deleting a directory without recursive=true, upload-v2 writing in
//     place (not atomically). Transfers stream to and from disk.
//   - Commands: /process/execute feeds the command to sh on stdin and
//     returns one combined "result" (408 on its timeout). Sessions label
//     every output line with the daemon's 0x01x3 / 0x02x3 prefixes, end a
//     last unterminated line with "\n" and drop NUL bytes, like the daemon's
//     `while IFS= read -r line` labellers; the exit code appears only after
//     the log is complete; deleting a session kills its process group.
//     Logs are rendered per client like the daemon: JSON with split streams
//     for SDKs sending X-Daytona-SDK-Version, the raw labelled log for
//     X-Daytona-Split-Output: true, combined text otherwise.
//   - Rate limiting: Throttle(n, d) answers the next n requests with 429,
//     Retry-After in whole seconds and the throttler's message.
//
// The sandbox file system: each sandbox has a root directory on the host
// (Options.Dir/<id>) and its paths ARE host paths below that root, so the
// file API and real `sh -c` commands agree on every absolute path. The home
// (and work-dir) is <root>/home/<user>, HOME and TMPDIR (<root>/tmp) are set
// for commands. The file API refuses paths outside the root with 403; commands
// are not confined (this is a test double, not a sandbox). The fake runs
// session commands with sh -c instead of sourcing them into a long-lived
// shell, so shell state does not carry across commands of one session; it
// does not implement autostop/archive, websocket log streaming or SendInput.
//
// Counters for leak checks: Live (sandboxes not being destroyed), Processes
// (running commands) and ToolboxSessions (open process sessions).
//
// Concurrency: one mutex guards all sandbox state; state transitions run on
// timers; Close kills every process and waits for them.
package daytonafake
