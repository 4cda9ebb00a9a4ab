// Command esfctl drives esfd over its unix socket: one verb per operation,
// human output by default, -o json for scripts.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	// The umask is only readable by setting it; do it before anything else
	// runs so files esfctl creates (tar exports) get the mode a user expects.
	umask := unix.Umask(0)
	unix.Umask(umask)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a := &app{
		stdin:  os.Stdin,
		stdout: os.Stdout,
		stderr: os.Stderr,
		umask:  os.FileMode(umask),
		isTTY:  isTerminal,
	}
	code := a.run(ctx, os.Args)
	stop()
	os.Exit(code)
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
