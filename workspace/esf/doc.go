// Package esf is esf itself as a workspace.Provider: a session is an esf
// group whose newest node runs in a runc attempt, on the daemon this
// process talks to through client.Client, on the same host.
//
// Mapping:
//
//   - Create: the image (a node id, a root id, or a local path imported
//     first) becomes a group; a draft forked off its root node is activated
//     with the runc executor, the session's env and the provider's limits.
//     The session id is the group id. The session's record (namespace,
//     home, working directory, env, lease TTL, metadata) is the group's
//     policy, so Attach needs nothing but the id.
//   - Run is esf exec of "sh -c command" with its stdout and stderr
//     streamed (and stdin, through the two-way form); the timeout is the
//     daemon's. Cancelling ctx returns at once: the daemon kills the
//     command's tree when it sees the client leave, a moment later (the
//     API offers no way to wait for that kill).
//   - Files are read and written on the attempt's writable root directly,
//     not through the container: every path resolves with openat2
//     RESOLVE_IN_ROOT against a descriptor of the root opened per call (a
//     descriptor held longer would keep the mount busy), so a symlink the
//     container made cannot lead outside it. Writes go to a temporary file
//     beside the target, are fsynced and renamed into place.
//   - Pause is esf suspend: the draft is sealed in place and the attempt
//     released. Resume forks a new draft off that seal and activates it.
//     Processes do not survive a pause; files do.
//   - Close releases the attempt without sealing, adds a tombstone node to
//     the group (groups cannot be deleted) and prunes every node below the
//     group's root so the daemon's GC can reclaim the seals.
//
// State lives in the journal, never in this process: the newest unpruned
// run node of the group decides (see Provider.lookup). A draft with a live
// attempt is running; a sealed node, or a draft nothing ran on yet, is
// paused; a draft whose attempts all ended unsealed is gone (its lease
// expired: the daemon reclaimed it) and reads as workspace.ErrNotFound,
// like a closed session. Create and Resume send each mutation with an
// idempotency key; when they fail or their context ends, cleanup replays
// the calls whose outcome is unknown under the same keys to learn what
// they made, releases it, and closes the group (Create) or prunes the new
// draft (Resume, so the session reads as paused again).
//
// Leases: an attempt's lease lasts Spec.Timeout (default
// Options.LeaseTTL); each call renews it once a third of it has passed,
// and Run renews it while the command runs. A session nobody calls is
// reclaimed by the daemon when its lease expires. A paused session holds
// no lease.
//
// Concurrency: a Session is safe for concurrent use. Its calls register
// while in flight; Pause and Close cut them (their contexts end with the
// cause ErrPaused or ErrClosed, which is what they then return) and wait
// for them before asking the daemon to unmount. Several handles of one
// session (Attach) coordinate only through the daemon: a handle whose
// attempt vanished asks the journal and answers ErrPaused or ErrNotFound.
//
// Errors: mapErr is the one table from esf's codes to the workspace
// classes; file operations return *fs.PathError with the io/fs class of
// the errno.
//
// The package is Linux only (openat2, overlay mounts), and the process
// must be able to open the daemon's attempt roots: in practice root on the
// daemon's host.
package esf
