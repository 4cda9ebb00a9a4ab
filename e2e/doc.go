// Package e2e holds end-to-end tests that build the real esfd and esfctl,
// run the daemon on a temporary state dir and socket, and drive it through
// the CLI the way a user or a script does: exit statuses, -o json output,
// files on disk, signals.
//
// TestMain builds both binaries once; each test starts its own daemon so
// that object counts and failures never leak between tests. The tests need
// root (ownership, setuid bits, trusted.* xattrs, device nodes) and skip
// with a message otherwise. The large-file fixture is 100 MiB, 8 MiB with
// -short.
package e2e
