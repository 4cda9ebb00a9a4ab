// Package sandbox is the seam for running one command somewhere else: a
// container, a remote micro-VM, a WASI module. It says nothing about where the
// command runs or how long the place lives; workspace.Session adds that
// lifecycle on top.
//
// A Sandbox runs a command line through a POSIX shell ("sh -c") in the
// sandbox's working directory. A command that ran and exited non-zero is a
// Result, not an error: errors are reserved for "the command could not be run
// or was stopped" (timeout, cancellation, a missing session, a provider
// failure). Implementations are safe for concurrent use: several Runs may be
// in flight on one Sandbox.
package sandbox
