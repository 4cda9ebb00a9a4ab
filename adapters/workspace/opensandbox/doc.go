// Package opensandbox is a workspace.Provider for OpenSandbox
// (github.com/alibaba/OpenSandbox): its lifecycle API (OpenAPI 0.1.0, under
// /v1) creates, finds, pauses, resumes and deletes sandboxes, and execd
// (OpenAPI 1.0.0, port 44772 inside each sandbox, reached through the
// endpoint the lifecycle API resolves) runs commands and moves files. It
// speaks both with net/http and encoding/json; no provider SDK.
//
// Mapping. Spec.Image is the image URI, Spec.Env the sandbox's env (so every
// command, on every handle, sees it), Spec.Timeout the TTL in seconds (at
// least 60, the API's floor), Spec.Metadata the metadata, which OpenSandbox
// requires to be Kubernetes label-safe. Credentials, endpoints, resource
// limits, entrypoint and the ownership tag are Config. Session IDs are
// sandbox ids.
//
// Invariants.
//   - Create leaves nothing behind on failure or cancellation: a sandbox it
//     made is deleted on a fresh context. A create request is never
//     abandoned mid-flight (the server would finish it unheard): after ctx
//     ends its answer is still awaited, up to CleanupTimeout, and a sandbox
//     whose id never came back is found by a random nonce in its metadata.
//   - Run never leaves a command running: execd keeps a command alive when
//     its client disconnects, so an ended ctx or Spec.Timeout interrupts it
//     (DELETE /command) before Run returns.
//   - Upload and Write replace atomically: a temporary sibling is uploaded
//     and renamed over the target (execd's own rename refuses an existing
//     target, so replacing one is a "mv -f" run through execd).
//   - A paused sandbox answers ErrPaused without a network call on every
//     handle this Provider holds on it (they share one record); a pause
//     made elsewhere is discovered when execd stops answering.
//   - Refusals are retried within bounds: 429 on any call whose body can be
//     replayed, 502/503/504 on idempotent ones, honouring Retry-After; an
//     exhausted or too-long wait is workspace.ErrPolicy with RetryAfter.
//
// What does not map. execd sends output a line per event with line ends
// stripped; Run restores them exactly by having the shell print an end
// marker after the command, but "\r" and "\r\n" arrive as "\n" and invalid
// UTF-8 as U+FFFD (the events are JSON strings). Stdin cannot be fed
// (ErrUnsupported). Glob and Grep walk the tree client-side (execd's search
// matches base names only). Symlink targets are not reported. Paths holding
// "$" are refused (execd expands variables in every path it is given). A
// replaced file keeps its mode but not its owner (execd chowns uploads to
// its own user). File failures other than a missing path reach the adapter
// as 500 RUNTIME_ERROR with the OS error in the text; "permission denied"
// is mapped to fs.ErrPermission, the rest is workspace.ErrProvider.
//
// Concurrency. Provider and sessions are safe for concurrent use. Every
// goroutine the package starts (the upload body writer, the cancel watcher
// of Run) ends before the call that started it returns.
package opensandbox
