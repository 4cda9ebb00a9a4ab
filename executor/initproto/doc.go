// Package initproto is the wire protocol between the runc executor (in the
// daemon) and the container's init (executor/init), through which execs
// start without a runc invocation.
//
// Why: `runc exec` costs about as much as starting the container (a
// re-executed runc, nsenter, cgroup and seccomp set-up), 100 ms and more on
// a busy 2-core host, and an exec is the hot path of every agent and
// rollout. The init is already inside every namespace, the cgroup, the
// seccomp filter and the capability set of the container, and so is every
// process it forks: for an exec with the container's own user and no
// terminal it can start the process itself, in about a millisecond.
//
// The channel: the executor binds a unix socket in the container's bundle
// (a private directory of the host, never visible in the container) and
// hands the listening socket to runc with --preserve-fds, so the init finds
// it at fd 3 and nothing inside the container can reach it by path. One
// connection per exec:
//
//	executor -> init   Request, with 4 fds: stdin, stdout, stderr, handshake
//	init -> executor   Started, with a pidfd of the new process (or Err)
//	executor -> child  one byte on the handshake: the host knows the pid, go
//	child -> executor  nothing (handshake closed by exec) or an error text
//	init -> executor   Exited, once the init has reaped the process
//
// The child the init forks is the init binary itself in trampoline mode
// (argv[0] == Trampoline): it waits for the go byte, so the process cannot
// end before the executor has read its host pid from the pidfd, resets
// the OOM score the init is exempt with, finds the command in the new
// environment's PATH and execs it. Its handshake fd is close-on-exec: end
// of file without a word means the command runs.
//
// A spare (Request.Spare, no command) is a trampoline forked ahead of its
// exec: the pool makes one in each idle container and moves it into the
// exec's cgroup while the container waits, so that the first exec after
// an adoption pays neither the fork nor the cgroup move (a move waits for
// an RCU grace period, milliseconds). Instead of the go byte it reads the
// command from its handshake, as a Request with the process's stdin,
// stdout and stderr attached, puts those in place, enters the directory
// and goes on as any trampoline; the reply is the same (end of file or an
// error text). It came from the same init, so the process inherits what
// any exec of the init does; pivot_root moved its root and directory with
// the init's at the adoption.
//
// The socket grants nothing the container lacks: a process of the
// container that took the listener over (same user, ptrace) could only
// answer in the init's place, starting processes with the init's own
// privileges or reporting statuses of its choosing; an exec as another
// user never goes through it.
//
// A frame is a 4-byte big-endian length and that many bytes of JSON; file
// descriptors travel as SCM_RIGHTS with a frame's first bytes. Only the
// first frame in each direction carries any.
package initproto
