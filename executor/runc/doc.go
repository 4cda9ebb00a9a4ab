// Package runc is the OCI/Linux executor: containers run by the runc binary
// (Debian's package), driven through containerd's go-runc, with specs built
// by containerd's pkg/oci helpers and its default seccomp profile.
//
// Every container gets containerd's default spec: fresh pid, ipc, uts,
// mount and network namespaces (the network namespace has only a loopback,
// which runc brings up), the default capability set, no-new-privileges,
// masked and read-only kernel paths, the default device cgroup, and the
// seccomp profile. Its root is the caller's directory, read-write (the
// attempt's overlay root). Its PID 1 is the worker's static init
// (executor/init), bind-mounted read-only at executor.InitPath, so an image
// needs no helper at all; it is exempt from the OOM killer (when the daemon
// holds CAP_SYS_RESOURCE), since its death would end the container. Limits
// map to cgroups: memory limit, pids limit, CFS quota. The cgroup is
// /<Namespace>/<id> in every hierarchy.
//
// State layout under Options.StateDir, all of it private (0700):
//
//	runc/                 runc's --root (its state of every container)
//	bundles/<id>/         config.json, footprint.json, runc.log, exec-*/
//	pool/<runc id>/       the stub root of a pool container (see Pool)
//
// Nothing else is kept, in memory or elsewhere: a restarted daemon finds
// every container again by id (List, then use or Stop), and Stop of an id
// removes whatever a crash left, from runc's state to the bundle.
//
// Exec has two ways to start a process. An exec with the container's own
// user and no terminal is started by the init itself (package initproto):
// the executor binds a unix socket in the bundle and runc hands the
// listening socket to the init (--preserve-fds), which forks the process
// with the executor's pipes as its stdio, as a session leader, and reports
// its exit status when it reaps it. The process inherits from the init
// exactly what runc exec would give it (namespaces, cgroup, capabilities,
// no-new-privileges, seccomp, rlimits, umask; TestExecThroughInit compares
// the two), except the init's OOM exemption, which the trampoline resets.
// That costs a fork and two execs instead of a runc invocation (about 100
// ms here). A frozen container is refused up front (its init would not
// answer); a container whose init has no socket (started by an older
// executor) falls back to runc exec.
//
// Every other exec runs "runc exec" in the foreground with a full process
// spec derived from the container's (so capabilities, rlimits and
// no-new-privileges carry over). runc stays the process's parent, reaps it
// and exits with its status, 128+N for a signal, so the daemon needs no
// subreaper (runc --detach would reparent every exec'd process to the
// daemon). The host pid comes from runc's pid file: its appearance is how
// Exec knows the process started, and its absence when runc exits means it
// never did (runc's log then says why, and Exec returns that as its error).
//
// Output: in the foreground runc copies the process's stdout and stderr
// through pipes of its own and exits when they close; an exec of the init
// writes to the executor's pipes directly, and ends when the init has
// reported its status and the pipes have closed. Either way an exec ends
// when its process has exited and nothing holds its output any more: a
// background process that keeps stdout open holds Wait until it exits, as
// with docker exec or ssh. Exec pumps runc's pipes into the caller's
// writers as data arrives. With a TTY, runc makes the container's pty and
// proxies it to its own stdio, the slave of a host pty whose master Exec
// keeps: output (stdout and stderr merged, as on any terminal) is read
// from it, input written to it, and Resize sizes it and sends runc the
// SIGWINCH on which runc copies the size inward.
//
// Kill: every exec gets a cgroup of its own below the container's
// (execcgroup.go; v1: in the freezer hierarchy), entered before its command
// runs (the init's trampoline waits for it; runc exec --cgroup), so
// everything the exec starts stays there whatever session or parent it
// takes. When an exec's context ends, Exec kills that cgroup (v1: freeze,
// SIGKILL every task, thaw; v2: cgroup.kill), and then the process, its
// session and its descendants as the container's cgroup shows them,
// signalled through pidfds checked against the start time, so a recycled
// pid is never hit. An exec that ended on its own leaves its background
// processes running; its cgroup goes when they do, or with the container.
// If something holds the output past the kill, runc is killed after a
// grace period so that Wait still returns, and an init that does not
// report the exit (stopped) counts as having reported the SIGKILL.
//
// Containers run in a user namespace when Options.UserNS says so: the
// container's ids 0..Count-1 are host ids Start.., its rootfs is
// bind-mounted where the namespace's root can walk to it (runc mounts the
// rootfs as that root), and CAP_FSETID, CAP_SETFCAP and CAP_MKNOD are
// dropped unless Spec.CapAdd gives them back. The init is undumpable.
//
// Pool (Options.PoolSize, SetPoolSize; esfd --runc-pool): a runc run
// costs a container's whole creation (runc's re-exec, namespaces, the
// rootfs's mounts, seccomp, cgroups), well over a hundred milliseconds.
// The executor keeps that many idle containers started in the background,
// each made exactly as Start makes one (the same spec generator: seccomp,
// capabilities, namespaces, masked paths, user namespace, the init), on a
// stub root: an empty directory under StateDir/pool/<runc id> holding only
// the mountpoint /.esf-adopt. A Start whose spec an idle container can
// serve (the init's user is root and no CapAdd: the init's credentials are
// fixed at its creation) adopts one instead of running runc:
//
//  1. The attempt's footprint is checked and recorded as for a cold
//     start, the bundle's config.json becomes the attempt's spec (its
//     rootfs, env, workdir, limits, mounts; the pool container's cgroup
//     path and runc root), and the mountpoints runc would have made in
//     the attempt's root are made, never through a symlink.
//  2. On the host, open_tree(OPEN_TREE_CLONE) takes a detached copy of the
//     attempt root's mount (not of its submounts) and of each extra
//     mount's source (recursive, as rbind; made nosuid, nodev and maybe
//     read-only with mount_setattr).
//  3. A goroutine locks its OS thread, unshares its fs struct and joins
//     the container's mount namespace (the pid is the init's, proven by a
//     pidfd held since the container started). There it attaches the
//     root's copy at /.esf-adopt, moves every mount that lies right below
//     the stub's root (proc, dev, sys, run, the init's bind, each with its
//     own submounts: masked and read-only paths, /dev/pts...) to the same
//     path under it (the target is opened with RESOLVE_BENEATH and
//     RESOLVE_NO_SYMLINKS), attaches the extra mounts, and pivot_roots
//     onto it as runc does (pivot_root(".", "."), the old root made a
//     slave and detached): the kernel moves the root and working directory
//     of every process that had the stub's, i.e. of the init, so every
//     process it forks, and every runc exec (which takes the namespace's
//     root), lives in the attempt's root. The hostname is set the same
//     way in the container's uts namespace. The thread then joins the
//     daemon's namespaces again and ends with its goroutine: Go parks a
//     locked main thread forever instead of ending it, and one parked in
//     the container's namespace would pin the attempt's overlay, and the
//     FUSE projection below it, for the daemon's life.
//  4. The limits are written into the container's cgroup files (v1 or v2)
//     as runc writes them at a start; the pool starts without any.
//  5. The bundle is renamed to the caller's id (renameat2 NOREPLACE) and
//     holds a symlink runc-id naming the id runc knows it by: runc cannot
//     rename a container, so every runc call (delete, pause, ps, exec,
//     state) and the freezer path go through that name. List shows the
//     caller's id, never an idle pool container.
//
// An idle container also holds a spare (spare.go, initproto.Spare): a
// trampoline its init forked while idle, already moved into an exec
// cgroup of its own. The first exec after the adoption hands it the
// command and stdio instead of asking the init to fork: a process's move
// into a cgroup waits for an RCU grace period (10-25 ms on 2-vCPU VMs,
// cgroup v1 or v2 without favordynmods), most of what that exec cost.
// A cold Start makes one in the background once runc run has returned,
// so that the move overlaps what the caller does before the first exec
// (which waits for a spare still under way). The spare serves the first
// exec or none (a terminal, another user: it is killed, and its cgroup
// goes with it), so only execs that run beside the first one may see it
// while it is handed over, and what the command inherits is
// what any exec of the init gets (TestFirstExecThroughSpare compares it
// with the init's and runc exec's, cold and pooled).
//
// The container seen from inside is the cold one's: the same mount table
// (TestPool_AdoptedContainerIsItsSpecs compares them, and the cgroup
// limits), and the isolation and boundary tests run both ways
// (coldAndPooled). What an idle container ran before adoption is only its
// init, which the executor controls; nothing of one attempt can reach the
// next, since a pool container serves one Start and is deleted with it. A
// step that fails discards the pool container (Stop removes the footprint
// the rewritten config names) and the Start proceeds cold; a crash in
// between leaves a pool container that the next executor on the state dir
// stops as soon as its pool is sized or limited, to any size, 0 included
// (esfd does both at start, whatever its --runc-pool), or closed (esfd
// stop-all, through ClosePool). The pool is capped by SetPoolLimit
// (executor.PoolLimiter): esfd's live-attempt quota gives it only the room
// live attempts leave, so idle and live containers together stay within
// --max-attempts. Every Start takes its place from that room at once,
// adopted or not: a Start the pool cannot serve (a cold start) first stops
// an idle container beyond it (TestPool_ColdStartEvictsAnIdleContainer),
// and a refill under way when the pool was empty finds no room when it is
// ready (only it may run beside the cold start, briefly). Taking a container asks for a replacement, which waits
// for the adopted container's first exec to end (or its Stop) while
// another idle container remains: a runc run is CPU-heavy, and the first
// command is what an activation waits for; at most one refill per CPU
// runs at a time, so that an emptied pool gets its first replacement
// soonest. A refill learns its container's init from runc's state file,
// not from runc state. Shrinking stops the surplus; ClosePool stops every
// idle one.
//
// Stop ends a container without waiting on runc (stop.go): it SIGKILLs
// the init through a pidfd, thaws the freezer, awaits the init's exit on
// the pidfd (the kernel has then killed and reaped every other process of
// the container's pid namespace) and removes the cgroups and runc's state
// as runc delete would; anything unexpected is left to runc delete
// --force, which polls for the exit every 100 ms.
//
// runc itself is always called with a context that a caller's cancellation
// does not reach (go-runc would SIGKILL runc, which leaves half-made
// containers and orphaned processes); control commands are bounded by
// Options.CommandTimeout instead, and cancellation is honoured between them
// (Start that sees its context end removes what it made).
//
// Concurrency: an Executor is safe for concurrent use. Start, Freeze, Thaw
// and Stop of one id are serialised by a lock per id; Exec takes no lock.
package runc
