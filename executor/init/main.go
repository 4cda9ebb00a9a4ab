package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/esf-dev/esf/executor/initproto"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2); syscall has
// no name for it and x/sys/unix would be the only dependency.
const prSetChildSubreaper = 36

func main() {
	if len(os.Args) > 0 && os.Args[0] == initproto.Trampoline {
		trampoline(os.Args[1:])
		return
	}
	if len(os.Args) == 1 && os.Args[0] == initproto.Spare {
		spare()
		return
	}
	// Undumpable: nothing in the container without CAP_SYS_PTRACE may
	// ptrace the init (a stopped PID 1 would hold every exec) or read its
	// memory. Its children are dumpable again once they exec.
	syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0)
	// Subscribe before anything can exit: a SIGCHLD lost between reap and
	// Notify would leave a zombie until the next one.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	if os.Getpid() != 1 {
		syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	}
	var a *agent
	if ln := inheritedListener(); ln != nil {
		a = newAgent(ln)
		go a.serve()
	}
	a.reap()
	for s := range sigs {
		a.reap()
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
	}
}

// reapAll waits for every child that has exited and hands each pid and
// status to exited (which may be nil). Signals coalesce, so one SIGCHLD
// may stand for many exits: loop until none is left.
func reapAll(exited func(pid int, ws syscall.WaitStatus)) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if exited != nil {
			exited(pid, ws)
		}
	}
}
