package e2b

import (
	"runtime"

	"golang.org/x/sys/unix"
)

func closeFD(fd int) error { return unix.Close(fd) }

// asSandboxRoot runs fn as the sandbox's root sees files: with the
// container in a user namespace, its root is host id uid, and the
// attempt's root accepts only ids of the namespace (an idmapped mount
// refuses host root's writes). fn then runs on a thread of its own whose
// file-system ids are uid (setfsuid, setfsgid: what the kernel checks
// and records for file access, and what the idmapped layers translate
// back to the sandbox's 0). Changing them away from 0 also drops the
// thread's file capabilities, so fn has exactly the sandbox root's
// access as the host sees it. The thread is never handed back to the
// runtime: it ends with fn's goroutine.
func asSandboxRoot(uid uint32, fn func() error) error {
	if uid == 0 {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		unix.Setfsgid(int(uid))
		unix.Setfsuid(int(uid))
		if got, _ := unix.SetfsuidRetUid(-1); got != int(uid) {
			errc <- &rpcError{Code: codeInternal, Message: "setfsuid did not take"}
			return
		}
		errc <- fn()
	}()
	return <-errc
}
