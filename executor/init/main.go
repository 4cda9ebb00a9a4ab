package main

import (
	"os"
	"os/signal"
	"syscall"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2); syscall has
// no name for it and x/sys/unix would be the only dependency.
const prSetChildSubreaper = 36

func main() {
	// Subscribe before anything can exit: a SIGCHLD lost between reap and
	// Notify would leave a zombie until the next one.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	if os.Getpid() != 1 {
		syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	}
	reap()
	for s := range sigs {
		reap()
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
	}
}

// reap waits for every child that has exited. Signals coalesce, so one
// SIGCHLD may stand for many exits: loop until none is left.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
