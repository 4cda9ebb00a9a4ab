// Command init is the PID 1 of every esf container, bind-mounted read-only
// at /.esf/init so that target images need no init of their own (FR-09).
//
// It does four things: it keeps the container alive while nothing else
// runs in it, it reaps the zombies of orphans the kernel reparents to it
// (a PID 1 that does not wait leaks one process table entry per orphan,
// until the pids limit refuses forks), it starts the executor's execs when
// the executor gave it a socket at fd 3 (package initproto: one fork and
// two execs instead of a runc exec), and it exits on SIGTERM or SIGINT,
// which makes the kernel kill everything left in the pid namespace. As
// PID 1 it receives only the signals it handles, so nothing else ends it
// short of SIGKILL from outside.
//
// The processes it starts are the same binary in trampoline mode
// (argv[0] "esf-exec", see initproto): it waits for the executor's go,
// resets the OOM score (the init is exempt from the OOM killer, the
// sandbox's processes must not be), sets HOME from /etc/passwd when the
// environment lacks it (as runc does), finds the command in PATH and
// execs it. Reaping and starting share a lock, so a process that ends at
// once is never reaped before its status has somewhere to go.
//
// It must stay tiny and static: build it with
//
//	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o esf-init ./executor/init
//
// It prints nothing and has no flags. Outside a pid
// namespace (tests) it marks itself a child subreaper, so orphans of its
// descendants still come to it.
package main
