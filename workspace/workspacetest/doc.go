// Package workspacetest is the conformance suite every workspace.Provider
// runs: the fake, esf itself, and each remote adapter against its offline
// fake server (and, opt-in, the live service). Run(t, Harness) drives it:
//
//	func TestConformance(t *testing.T) {
//		workspacetest.Run(t, workspacetest.Harness{Provider: p, LargeFile: 256 << 20})
//	}
//
// The suite checks only what the contract promises (workspace, vfs and
// sandbox doc comments; docs/workspace.md lists every subtest). Subtests
// run one after another, never in parallel with each other; each creates
// the sessions it needs and closes them in its cleanup, so any one can run
// alone with -run, and a final subtest compares the provider's session
// count with the count before the suite. Counting uses Harness.Sessions,
// else the Provider's workspace.Enumerator; a provider with neither fails,
// because leaks are half of what the suite is for.
//
// Every call gets a context bounded by Harness.OpTimeout. Large files come
// from a seeded generator and are compared by SHA-256 on both sides, so the
// suite never holds a file in memory whatever LargeFile is; the seed is
// logged and SeedEnv replays it.
//
// The commands it runs are plain POSIX sh with echo, cat, pwd, printf, env,
// sleep, exit, true, false, wc and chmod: they mean the same on a
// busybox image, in a remote sandbox and in workspace/fake's interpreter.
// It assumes /tmp exists and that sessions created from one Spec share a
// home directory.
//
// A check that cannot fail is a defect: workspace/fake's tests run the suite
// against deliberately broken decorators of the fake and require each to
// fail in the subtest that owns the broken promise.
package workspacetest
