// Package failpoint holds named fault-injection points for the crash
// harness: code calls Inject(name) at each journal boundary of a mutating
// operation, and a failpoint armed for that name makes the call return an
// error or kill the process on the spot.
//
// Names are "<package>.<operation>.<boundary>", e.g.
// "journal.update.before-commit" or "fabric.fork.after-commit". Owners
// Declare their names at package init so a harness can list every one with
// Names and arm each in turn.
//
// Arming. In tests, Enable(name, fn) arms one point in-process. For a child
// process, the environment variable ESF_FAILPOINTS holds a spec read at
// startup:
//
//	ESF_FAILPOINTS="journal.update.after-commit=crash;fabric.fork.before-commit=error@3"
//
// Entries are separated by ';' or ','. Each is name=action[@N]; the action
// fires on the N-th evaluation of the point and every later one (N defaults
// to 1). Actions:
//
//	crash   SIGKILL this process: no deferred calls, no flushes, no exit
//	        handlers — what a power cut leaves, minus the page cache.
//	error   return an error wrapping ErrInjected (an ErrUnavailable).
//	off     do nothing (a placeholder that keeps a spec well formed).
//
// A malformed ESF_FAILPOINTS makes every Inject return the parse error, so
// a harness typo fails loudly rather than testing nothing.
//
// Concurrency: all functions are safe for concurrent use. A disarmed Inject
// is one atomic load.
package failpoint
