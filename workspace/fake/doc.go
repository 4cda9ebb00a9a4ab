// Package fake is an in-memory workspace.Provider for tests: sessions are
// maps of paths to immutable file contents, Run is a tiny shell interpreter,
// and nothing leaves the process. It passes workspace/workspacetest like a
// real provider, so a product can test its session handling offline, and it
// offers what a real provider cannot: fault injection at the seam
// (Options.Fault), a clock (Options.Now) and a live-session count (Live).
//
// Sessions. A session's state (files, paused flag, metadata) lives in the
// Provider; a *Session is one handle to it, so Attach returns a second
// handle to the same files. Close removes the state; the closing handle
// answers ErrClosed afterwards, every other handle ErrNotFound. Attach never
// changes state: a paused session's new handle answers ErrPaused. Spec.Timeout
// is honoured lazily: a running session older than it (counted from Create or
// the last Resume) is reclaimed the next time anyone looks it up; paused
// sessions do not expire.
//
// Files. Each file's content is an immutable list of chunks, replaced whole
// by Write, Upload, chmod and shell redirections, so readers (Read,
// Download) hold no lock while they copy and never see a mix of two
// versions. Upload collects the stream in 1 MiB chunks and installs it only
// after io.EOF: a failed or cancelled upload leaves the old file. The fake
// holds every byte it is given: a 1 GiB upload holds 1 GiB of memory (once,
// not twice). Symlinks are not modelled.
//
// Run is a fake shell, not sh. It understands the commands listed on Run and
// "cmd; cmd", "cmd && cmd", "cmd || cmd", redirections (> >> < 2> >&2 2>&1),
// quotes and $VAR expansion without field splitting; anything else it
// reports as "not found" with exit status 127, the way sh does. It exists so
// the conformance suite's commands (plain POSIX sh and coreutils) mean the
// same thing here as in a container.
//
// Concurrency: Provider and Session are safe for concurrent use. Run reads
// Spec.Stdin in the calling goroutine, only when a command reads its stdin;
// no goroutine outlives a call.
package fake
