// Package workspace is the provider-neutral contract for a stateful sandbox
// session: create or attach, run commands, move files, optionally pause and
// resume, close. esf is one provider (workspace/esf); remote services (E2B,
// Daytona, OpenSandbox, CubeSandbox) are others, each an adapter module of its
// own under adapters/workspace so this package never imports a provider SDK.
//
// The decisions behind the shape, with compatibility notes, are written down
// in docs/workspace.md. In short:
//
//   - A Session embeds sandbox.Sandbox and vfs.Backend: every provider tested
//     offers both, and embedding keeps existing callers of those seams
//     working with a session unchanged.
//   - Optional capabilities are separate interfaces found by type assertion
//     (Pauser, Enumerator), never methods that fail at run time.
//   - Attach is part of Provider; a provider that cannot attach returns
//     ErrUnsupported. Attach never changes a session's state: attaching to a
//     paused session gives a handle whose Run and file operations return
//     ErrPaused until Resume.
//   - IDs are opaque strings, unique within the provider's configured
//     account and region; products store them, never parse them.
//   - Errors: the classes in errors.go, tested with errors.Is; provider
//     failures carry a *ProviderError (errors.As) with the provider's own code.
//   - Upload streams and replaces the file atomically; Download streams.
//     Transfers are of single regular files; directories travel as archives
//     through Run.
//
// Concurrency: Provider and Session methods are safe for concurrent use;
// a Session's Close makes every later call on that handle return ErrClosed.
package workspace
