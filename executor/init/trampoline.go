package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/esf-dev/esf/executor/initproto"
)

// trampoline becomes the command args (see package initproto): it waits
// for the executor's go, undoes what the process inherited from the init
// but must not keep, and execs. Whatever stops it is written on the
// handshake for the executor to return.
func trampoline(args []string) {
	hs := os.NewFile(initproto.HandshakeFd, "handshake")
	fail := func(code int, format string, a ...any) {
		fmt.Fprintf(hs, format, a...)
		os.Exit(code)
	}
	var b [1]byte
	if n, _ := hs.Read(b[:]); n != 1 {
		os.Exit(126) // the executor went away before the process started
	}
	if len(args) == 0 || args[0] == "" {
		fail(127, "no command")
	}
	if err := resetOOMScore(); err != nil {
		fail(126, "oom score: %v", err)
	}
	// As runc does: a missing HOME comes from the user's passwd entry.
	if os.Getenv("HOME") == "" {
		os.Setenv("HOME", home(os.Getuid()))
	}
	path, err := exec.LookPath(args[0])
	if err != nil && !errors.Is(err, exec.ErrDot) {
		fail(127, "%v", err)
	}
	syscall.CloseOnExec(initproto.HandshakeFd)
	err = syscall.Exec(path, args, os.Environ())
	fail(126, "exec %s: %v", args[0], err)
}

// resetOOMScore gives the process the default OOM score: the init is
// exempt from the OOM killer, and a sandbox's processes must stay
// killable. Raising a score needs no privilege.
func resetOOMScore() error {
	const name = "/proc/self/oom_score_adj"
	b, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return err
	}
	if v >= 0 {
		return nil
	}
	return os.WriteFile(name, []byte("0"), 0)
}

// home is uid's home directory in /etc/passwd, "/" when the image has
// none.
func home(uid int) string {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return "/"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	want := strconv.Itoa(uid)
	for sc.Scan() {
		// name:password:uid:gid:gecos:home:shell
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 6 && fields[2] == want && fields[5] != "" {
			return fields[5]
		}
	}
	return "/"
}
