package e2b

import "golang.org/x/sys/unix"

func closeFD(fd int) error { return unix.Close(fd) }
