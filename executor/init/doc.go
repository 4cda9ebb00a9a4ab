// Command init is the PID 1 of every esf container, bind-mounted read-only
// at /.esf/init so that target images need no init of their own (FR-09).
//
// It does three things: it keeps the container alive while nothing else
// runs in it (execs come and go through runc exec), it reaps the zombies
// of orphans the kernel reparents to it (a PID 1 that does not wait leaks
// one process table entry per orphan, until the pids limit refuses forks),
// and it exits on SIGTERM or SIGINT, which makes the kernel kill everything
// left in the pid namespace. As PID 1 it receives only the signals it
// handles, so nothing else ends it short of SIGKILL from outside.
//
// It must stay tiny and static: build it with
//
//	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o esf-init ./executor/init
//
// It prints nothing, reads nothing, and has no flags. Outside a pid
// namespace (tests) it marks itself a child subreaper, so orphans of its
// descendants still come to it.
package main
