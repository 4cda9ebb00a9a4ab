// Command ptrace attaches to a pid as a sandboxed attacker would, and says
// whether it could: "attached" (then it detaches) or the error.
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
)

func main() {
	pid, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	runtime.LockOSThread()
	if err := syscall.PtraceAttach(pid); err != nil {
		fmt.Println("attach:", err)
		os.Exit(1)
	}
	var ws syscall.WaitStatus
	syscall.Wait4(pid, &ws, syscall.WALL, nil)
	syscall.PtraceDetach(pid)
	fmt.Println("attached")
}
