package e2e

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/console"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/wasi/wasitest"
)

// busyboxTree is a root whose /bin holds a static busybox and the applets
// the test runs.
func busyboxTree(t *testing.T, d *daemon) string {
	t.Helper()
	testenv.Require(t, "busybox") // static, for the container's root
	bb := testenv.BusyboxPath
	dir := smallTree(t, d, map[string]string{"etc/hostname": "box\n"})
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(bb)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(dir, "bin", "busybox"), os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	for _, applet := range []string{"sh", "echo", "sleep", "cat", "wc", "stty", "tty", "id", "env", "ps"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestExecVerb: esfctl exec copies the command's output, exits with its
// status, 128+N when a signal killed it, and 8 when --timeout did.
func TestExecVerb(t *testing.T) {
	requireFUSE(t)
	testenv.Require(t, "runc")
	d := startDaemon(t)
	g := createGroup(t, d, busyboxTree(t, d))
	kid := fork(t, d, g.Node.NodeID, 1)[0]
	a := activate(t, d, kid, "--executor", "runc")

	r := d.ctl(nil, "exec", a.AttemptID, "--env", "X=42", "--", "/bin/sh", "-c", "echo out $X; cat /etc/hostname; echo err >&2; exit 3")
	if r.code != 3 || r.stdout != "out 42\nbox\n" || r.stderr != "err\n" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = d.ctl(nil, "exec", a.AttemptID, "--", "/bin/sh", "-c", "kill -9 $$")
	if r.code != 137 {
		t.Fatalf("exec killed by SIGKILL: exit %d, stderr %q", r.code, r.stderr)
	}
	r = d.ctl(nil, "-o", "json", "exec", a.AttemptID, "--timeout", "300ms", "--", "/bin/sleep", "30")
	if r.code != 8 {
		t.Fatalf("exec past its timeout: exit %d, stderr %q", r.code, r.stderr)
	}
	jsonErr(t, r, "deadline_exceeded")
	// What the command wrote is in the attempt's tree.
	d.mustCtl(nil, "exec", a.AttemptID, "--", "/bin/sh", "-c", "echo made > /made.txt")
	if got := readFile(t, filepath.Join(a.Root, "made.txt")); strings.TrimSpace(got) != "made" {
		t.Fatalf("file written by exec: %q", got)
	}
	// An interrupted esfctl kills its command: once the command is known to
	// run, a SIGINT to esfctl ends it, and the marker it would write after
	// its sleep never appears. No step depends on how fast this machine is:
	// the test waits for the command to start and for it to be gone.
	cmd := exec.Command(esfctlBin, "exec", a.AttemptID, "--", "/bin/sh", "-c", "echo up > /started.txt; exec sleep 600")
	cmd.Env = append(os.Environ(), "ESF_SOCKET="+d.socket)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the command to start", func() bool {
		_, err := os.Stat(filepath.Join(a.Root, "started.txt"))
		return err == nil
	})
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 8 {
		t.Fatalf("interrupted exec: %v, want exit 8", err)
	}
	// A command that ran on would still be listed: sleep 600 outlives the wait.
	waitUntil(t, "the interrupted command to be gone", func() bool {
		r := d.ctl(nil, "exec", a.AttemptID, "--", "/bin/ps", "-o", "args")
		return r.code == 0 && !strings.Contains(r.stdout, "sleep 600")
	})
	// Release stops the container; stop-all at teardown does not wait
	// for a live container's mounts (see the report).
	d.mustCtl(nil, "release", a.AttemptID)
}

// requireRunc skips without what runc attempts need.
func requireRunc(t *testing.T) {
	t.Helper()
	requireFUSE(t)
	testenv.Require(t, "runc")
}

// TestExecStdin: esfctl exec -i copies its stdin to the command, whole,
// and its end reaches the command; a command that stops reading early
// still ends the exec.
func TestExecStdin(t *testing.T) {
	requireRunc(t)
	d := startDaemon(t)
	g := createGroup(t, d, busyboxTree(t, d))
	a := activate(t, d, g.Node.NodeID, "--executor", "runc")
	defer d.mustCtl(nil, "release", a.AttemptID)

	r := d.ctl(strings.NewReader("hello\n"), "exec", "-i", a.AttemptID, "--", "cat")
	if r.code != 0 || r.stdout != "hello\n" {
		t.Fatalf("echo hello | esfctl exec -i -- cat: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	big := make([]byte, 3<<20+1)
	rand.Read(big)
	r = d.ctl(bytes.NewReader(big), "exec", a.AttemptID, "-i", "--", "sh", "-c", "wc -c; echo err >&2; exit 6")
	if r.code != 6 || strings.TrimSpace(r.stdout) != strconv.Itoa(len(big)) || r.stderr != "err\n" {
		t.Fatalf("wc -c of %d bytes: exit %d, stdout %q, stderr %q", len(big), r.code, r.stdout, r.stderr)
	}
	text := bytes.Repeat([]byte("abcdefg\n"), 1<<19)
	r = d.ctl(bytes.NewReader(text), "exec", "-i", a.AttemptID, "--", "sh", "-c", "read -n 3 x; echo $x")
	if r.code != 0 || r.stdout != "abc\n" {
		t.Fatalf("a command that reads 3 bytes of %d: exit %d, stdout %q, stderr %q", len(text), r.code, r.stdout, r.stderr)
	}
	// Without -i the command's stdin is empty, whatever esfctl's.
	r = d.ctl(strings.NewReader("ignored\n"), "exec", a.AttemptID, "--", "sh", "-c", "cat; echo end")
	if r.code != 0 || r.stdout != "end\n" {
		t.Fatalf("exec without -i: exit %d, stdout %q", r.code, r.stdout)
	}
}

// ptyPair opens a pseudo-terminal of the given size: the master for the
// test, the slave for esfctl.
func ptyPair(t *testing.T, rows, cols uint16) (console.Console, *os.File) {
	t.Helper()
	master, slavePath, err := console.NewPty()
	if err != nil {
		t.Fatalf("no pty: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := master.Resize(console.WinSize{Height: rows, Width: cols}); err != nil {
		t.Fatal(err)
	}
	slave, err := os.OpenFile(slavePath, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slave.Close() })
	return master, slave
}

// termProc is esfctl running on a test terminal.
type termProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it exited
}

// onTerminal starts esfctl with the slave as its controlling terminal and
// stdio, copying what it writes into out.
func onTerminal(t *testing.T, d *daemon, master console.Console, slave *os.File, out *syncBuffer, args ...string) *termProc {
	t.Helper()
	p := &termProc{cmd: exec.Command(esfctlBin, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "ESF_SOCKET="+d.socket)
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = slave, slave, slave
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill() // a test that failed half way
		<-p.done
	})
	go io.Copy(out, master) // ends when the master closes
	return p
}

// exitCode waits for esfctl to exit.
func (p *termProc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(30 * time.Second):
		t.Fatal("esfctl did not exit")
		return -1
	}
}

func waitFor(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("terminal output %q never showed %q", out.String(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitUntil polls cond until it holds; the deadline only bounds a test
// that would otherwise hang, it is not what the test measures.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lineShell runs each line it reads, with no line editing (whose terminal
// queries a test terminal does not answer); ^C interrupts the line.
const lineShell = `trap "echo interrupted" INT; while read -r line; do eval "$line"; done`

// TestExecTTY: esfctl exec -t gives the command a terminal of esfctl's
// terminal's size; with -i it is interactive: raw mode here (the remote
// terminal echoes and takes ^C), window resizes follow (SIGWINCH), the
// exit status is the command's, and the local terminal is restored after.
func TestExecTTY(t *testing.T) {
	requireRunc(t)
	d := startDaemon(t)
	g := createGroup(t, d, busyboxTree(t, d))
	a := activate(t, d, g.Node.NodeID, "--executor", "runc")
	defer d.mustCtl(nil, "release", a.AttemptID)

	// A terminal per run: each has one reader of its master.
	master, slave := ptyPair(t, 33, 101)
	before, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	restored := func(slave *os.File) {
		t.Helper()
		after, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatal(err)
		}
		if after.Lflag != before.Lflag || after.Iflag != before.Iflag || after.Oflag != before.Oflag {
			t.Fatalf("terminal not restored: lflag %#x iflag %#x oflag %#x, was %#x %#x %#x",
				after.Lflag, after.Iflag, after.Oflag, before.Lflag, before.Iflag, before.Oflag)
		}
	}
	out := &syncBuffer{}
	p := onTerminal(t, d, master, slave, out, "exec", "-t", a.AttemptID, "--", "sh", "-c", "tty; stty size; exit 4")
	if code := p.exitCode(t); code != 4 {
		t.Fatalf("exec -t: exit %d, output %q", code, out.String())
	}
	// The remote terminal's line endings arrive as they are: the local
	// one adds no \r of its own.
	waitFor(t, out, "\r\n33 101\r\n")
	if !strings.HasPrefix(out.String(), "/dev/pts/") || strings.Contains(out.String(), "\r\r") {
		t.Fatalf("exec -t: %q", out.String())
	}
	restored(slave)

	master, slave = ptyPair(t, 33, 101)
	out = &syncBuffer{}
	p = onTerminal(t, d, master, slave, out, "exec", "-it", a.AttemptID, "--", "sh", "-c", lineShell)
	// Type only once esfctl made its terminal raw, as a user would.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		tio, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatal(err)
		}
		if tio.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("esfctl exec -it left its terminal cooked: lflag %#x", tio.Lflag)
		}
	}
	io.WriteString(master, "stty size\r")
	waitFor(t, out, "stty size\r\n33 101\r\n")
	// Raw mode: ^C is a byte for the remote terminal, which interrupts
	// the command there; esfctl (no SIGINT) lives on.
	io.WriteString(master, "sleep 100\r")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if strings.Contains(d.mustCtl(nil, "exec", a.AttemptID, "--", "ps", "-o", "args").stdout, "sleep 100") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleep never started: %q", out.String())
		}
	}
	io.WriteString(master, "\x03")
	waitFor(t, out, "interrupted\r\n")
	if err := master.Resize(console.WinSize{Height: 50, Width: 120}); err != nil {
		t.Fatal(err)
	}
	// SIGWINCH and the next line race: ask until the new size shows.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "50 120") && time.Now().Before(deadline) {
		io.WriteString(master, "stty size\r")
		time.Sleep(200 * time.Millisecond)
	}
	waitFor(t, out, "50 120\r\n")
	io.WriteString(master, "exit 9\r")
	if code := p.exitCode(t); code != 9 {
		t.Fatalf("exec -it: exit %d, output %q", code, out.String())
	}
	restored(slave)
}

// TestExecWASIStdin: a wasi attempt's module reads esfctl's stdin with -i;
// -t is unsupported there.
func TestExecWASIStdin(t *testing.T) {
	requireFUSE(t)
	d := startDaemon(t)
	dir := smallTree(t, d, map[string]string{"readme": "x"})
	if err := os.WriteFile(filepath.Join(dir, "guest.wasm"), wasitest.Guest(t), 0o755); err != nil {
		t.Fatal(err)
	}
	g := createGroup(t, d, dir)
	a := activate(t, d, g.Node.NodeID, "--executor", "wasi")
	defer d.mustCtl(nil, "release", a.AttemptID)

	in := bytes.Repeat([]byte("from stdin\n"), 50000)
	r := d.ctl(bytes.NewReader(in), "exec", "-i", a.AttemptID, "--", "/guest.wasm", "echo")
	if r.code != 0 || r.stdout != string(in) {
		t.Fatalf("wasi exec -i: exit %d, %d bytes out of %d, stderr %q", r.code, len(r.stdout), len(in), r.stderr)
	}
	r = d.ctl(strings.NewReader("ignored"), "exec", a.AttemptID, "--", "/guest.wasm", "echo")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("wasi exec without -i: exit %d, stdout %q", r.code, r.stdout)
	}
	r = d.ctl(nil, "-o", "json", "exec", "-t", a.AttemptID, "--", "/guest.wasm", "echo")
	if r.code != 10 {
		t.Fatalf("wasi exec -t: exit %d, stderr %q", r.code, r.stderr)
	}
	if msg := jsonErr(t, r, "unsupported"); !strings.Contains(msg, "terminal") {
		t.Fatalf("wasi exec -t: %q", msg)
	}
}

// TestActivateContainerFlags: --memory and --pids are the container's
// cgroup limits; --env, --workdir and --user are what its execs get.
func TestActivateContainerFlags(t *testing.T) {
	requireRunc(t)
	d := startDaemon(t)
	dir := busyboxTree(t, d)
	if err := os.MkdirAll(filepath.Join(dir, "work"), 0o777); err != nil {
		t.Fatal(err)
	}
	g := createGroup(t, d, dir)
	a := activate(t, d, g.Node.NodeID, "--executor", "runc", "--memory", "64M", "--pids", "32", "--cpus", "0.5",
		"--env", "GREETING=hi there", "--env", "B=2", "--workdir", "/work", "--user", "1000:1001")
	defer d.mustCtl(nil, "release", a.AttemptID)

	r := d.mustCtl(nil, "exec", a.AttemptID, "--", "sh", "-c", `echo "$GREETING/$B"; pwd; id -u; id -g`)
	if r.stdout != "hi there/2\n/work\n1000\n1001\n" {
		t.Fatalf("exec defaults: %q", r.stdout)
	}
	// An exec's own flags override the defaults.
	r = d.mustCtl(nil, "exec", a.AttemptID, "--env", "B=3", "--workdir", "/", "--user", "0:0", "--", "sh", "-c", `echo "$B"; pwd; id -u`)
	if r.stdout != "3\n/\n0\n" {
		t.Fatalf("exec overrides: %q", r.stdout)
	}
	// The limits, read where the kernel keeps them: the container's
	// cgroups (v1 or v2), found from inside.
	cg := strings.TrimSpace(d.mustCtl(nil, "exec", a.AttemptID, "--user", "0:0", "--", "cat", "/proc/self/cgroup").stdout)
	type cgroup struct {
		dir    string
		inside bool // a cgroup namespace: the container sees its cgroup as the root
	}
	dirs := map[string]cgroup{} // by controller, "" for v2
	for _, l := range strings.Split(cg, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			t.Fatalf("/proc/self/cgroup: %q", cg)
		}
		for _, c := range strings.Split(parts[1], ",") {
			dirs[c] = cgroup{filepath.Join("/sys/fs/cgroup", parts[1], parts[2]), parts[2] == "/"}
		}
	}
	read := func(controller, file string) string {
		g, ok := dirs[controller]
		if !ok {
			return ""
		}
		path := filepath.Join(g.dir, file)
		if g.inside {
			return strings.TrimSpace(d.mustCtl(nil, "exec", a.AttemptID, "--user", "0:0", "--", "cat", path).stdout)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	type limit struct{ controller, file, want string }
	limits := []limit{{"", "memory.max", fmt.Sprint(64 << 20)}, {"", "pids.max", "32"}, {"", "cpu.max", "50000 100000"}}
	if _, v1 := dirs["memory"]; v1 {
		limits = []limit{{"memory", "memory.limit_in_bytes", fmt.Sprint(64 << 20)}, {"pids", "pids.max", "32"}, {"cpu", "cpu.cfs_quota_us", "50000"}}
	}
	for _, l := range limits {
		if got := read(l.controller, l.file); got != l.want {
			t.Errorf("%s %s = %q, want %q", l.controller, l.file, got, l.want)
		}
	}
}

// TestActivateNoQueue: beyond the daemon's --max-attempts, activate
// --no-queue fails with quota_exceeded (exit 7) and leaves nothing; without
// it the attempt waits queued.
func TestActivateNoQueue(t *testing.T) {
	requireFUSE(t)
	d := startDaemonWith(t, "", "--max-attempts", "1")
	g := createGroup(t, d, smallTree(t, d, map[string]string{"a": "1"}))
	a := activate(t, d, g.Node.NodeID)
	r := d.ctl(nil, "-o", "json", "activate", g.Node.NodeID, "--no-queue")
	if r.code != 7 {
		t.Fatalf("activate --no-queue at capacity: exit %d, stderr %q", r.code, r.stderr)
	}
	jsonErr(t, r, "quota_exceeded")
	var q attemptJSON
	decode(t, d.mustCtl(nil, "-o", "json", "activate", g.Node.NodeID), &q)
	if q.State != "queued" {
		t.Fatalf("activate at capacity without --no-queue: %+v", q)
	}
	d.mustCtl(nil, "release", a.AttemptID)
	d.mustCtl(nil, "release", q.AttemptID)
}
