// Package daytona implements the workspace session contract on Daytona
// (https://daytona.io): a workspace.Provider with workspace.Enumerator whose
// sessions are Daytona sandboxes and implement workspace.Pauser. It speaks
// the Daytona API (OpenAPI "Daytona" 1.0, daytona/clients api.json) and the
// toolbox API behind each sandbox's toolboxProxyUrl (toolbox.json) with
// net/http and encoding/json only; no Daytona SDK. Credentials, endpoint,
// region and labels are Config, never workspace.Spec.
//
// Mapping:
//
//   - Create: POST /sandbox with a generated name "esf-<hex>", Spec.Image
//     as snapshot (ImageSnapshot) or buildInfo "FROM <image>" (ImageOCI),
//     Spec.Env as env, Spec.Metadata plus Config.Labels as labels,
//     Spec.Timeout as ttlMinutes (rounded up), then GET /sandbox/{id} with
//     backoff until "started" ("error"/"build_failed" fail with the state as
//     ProviderError.Code). Spec.WorkDir is kept in the label esf.dev/workdir
//     (so Attach knows it) and created with POST /files/folder. When ctx
//     ends, the sandbox is deleted on a fresh context - by name when the
//     create request went out but no answer came back - retrying Daytona's
//     409 while it is still starting. Create returns only after that.
//   - Attach: GET /sandbox/{idOrName}; a starting sandbox is waited for, a
//     stopped/archived/paused one gives a handle answering ErrPaused.
//   - Close: DELETE /sandbox/{id}; 409 (state change in progress) waits and
//     retries; a sandbox already being destroyed is ErrNotFound.
//   - Pause/Resume: POST /sandbox/{id}/stop and /start, waiting for
//     "stopped"/"started". Stop keeps the file system and loses processes
//     and memory. Daytona's /pause keeps memory but exists only for VM
//     sandbox classes (containers answer 422), and archive is slower to
//     come back from, so neither is used.
//   - Sessions: GET /sandbox?labels=<Config.Labels>&limit=200 following
//     nextCursor; Paused is "stopped, archived or paused, or on the way".
//   - Run: one toolbox process session per call (POST /process/session,
//     POST .../exec runAsync, poll GET .../command/{id} and .../logs with
//     backoff, DELETE the session always, which kills the process group).
//     The command text, stdin and environment are packed into one script
//     (see Run). /process/execute is used only for the `mv -f` of Upload.
//   - Files: GET /files (List), GET /files/info, GET /files/download
//     (streamed), POST /files/upload-v2 (multipart streamed through a pipe),
//     POST /files/permissions, POST /files/move, DELETE /files?recursive=true.
//     Glob and Grep are vfs.GlobWalk/GrepWalk over List and Read: the
//     toolbox's /files/search matches base names without "**" and
//     /files/find has no case folding, limit or binary rule.
//
// Errors: API 401/403/429 and 400s about quota are ErrPolicy (429 keeps
// Retry-After); 404 on a sandbox is ErrNotFound; 422 is ErrUnsupported;
// the rest ErrProvider. Toolbox answers are ambiguous - the proxy and
// runner answer for a stopped sandbox with 400 "Is the Sandbox started?"
// and for a deleted one with 401 or 404 - so a toolbox error with a JSON
// body (the daemon's file handlers answer with a bare status) is checked
// against the sandbox's state: gone is ErrNotFound, stopped is ErrPaused,
// otherwise file errors map 404/403/409 to fs.ErrNotExist/ErrPermission/
// ErrExist. A 429 on a request whose body can be replayed is retried up
// to Config.MaxRetries times after Retry-After (at most MaxRetryWait);
// streamed uploads are never retried.
//
// Concurrency: Provider and Session are safe for concurrent use. A Session
// holds its closed/paused flags and the home and working directory learnt
// from the toolbox behind one mutex; Close is serialised per handle. No
// goroutine outlives a call: Upload's body writer and its cancellation
// watcher are waited for before it returns.
package daytona
