package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
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
	var b [1]byte
	if n, _ := hs.Read(b[:]); n != 1 {
		os.Exit(126) // the executor went away before the process started
	}
	run(hs, args)
}

// spare is a trampoline started before its command (see package
// initproto): it waits for the command on its handshake, with the
// process's stdio, puts those in place and enters the directory, then
// goes on as trampoline does after its go.
func spare() {
	f := os.NewFile(initproto.HandshakeFd, "handshake")
	c, err := net.FileConn(f)
	f.Close() // c holds a close-on-exec duplicate
	if err != nil {
		os.Exit(126)
	}
	hs, ok := c.(*net.UnixConn)
	if !ok {
		os.Exit(126)
	}
	fail := func(code int, format string, a ...any) {
		fmt.Fprintf(hs, format, a...)
		os.Exit(code)
	}
	var req initproto.Request
	fds, err := initproto.Read(hs, &req)
	if err != nil {
		os.Exit(126) // the executor went away before the process started
	}
	if len(fds) != 3 {
		fail(126, "spare: %d fds, want stdin, stdout and stderr", len(fds))
	}
	for i, fd := range fds {
		if err := syscall.Dup3(fd, i, 0); err != nil {
			fail(126, "stdio: %v", err)
		}
		syscall.Close(fd)
	}
	if req.Dir != "" {
		if err := os.Chdir(req.Dir); err != nil {
			if errors.Is(err, syscall.EACCES) {
				fail(126, "%s%v", initproto.SpareDirDenied, err)
			}
			fail(126, "workdir %s: %v", req.Dir, err)
		}
	}
	os.Clearenv()
	for _, kv := range req.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			os.Setenv(k, v)
		}
	}
	run(hs, req.Args)
}

// handshake is where a trampoline reports what stopped it: the inherited
// fd, or a spare's connection.
type handshake interface {
	Write([]byte) (int, error)
}

// run execs args once the trampoline may: it undoes what the process
// inherited from the init but must not keep; the handshake closes on
// exec.
func run(hs handshake, args []string) {
	fail := func(code int, format string, a ...any) {
		fmt.Fprintf(hs, format, a...)
		os.Exit(code)
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
	if _, ok := hs.(*os.File); ok {
		syscall.CloseOnExec(initproto.HandshakeFd)
	}
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
