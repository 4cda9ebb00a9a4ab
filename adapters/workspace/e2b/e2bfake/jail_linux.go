package e2bfake

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The jail: each sandbox gets a holder process in a private mount
// namespace, where the host's system directories are bound read-only into
// the sandbox root (plus /dev and /proc) and the holder chroots there and
// sleeps. Commands enter that namespace and root with nsenter, so sandbox
// paths mean the same to commands as to the file RPCs: pwd prints
// /home/user and /tmp is the sandbox's own. The mounts exist only in the
// namespace and vanish with the holder. It needs root, mount, chroot and
// nsenter; without them the fake maps only the cwd.

var (
	jailOnce sync.Once
	jailOK   bool
	nsenter  string
	// jailBind are the host's top-level system directories bound into
	// every sandbox; jailLinks the top-level symlinks copied (merged-/usr
	// systems link /bin to usr/bin).
	jailBind  []string
	jailLinks = map[string]string{}
)

const holderScript = `set -e
r=$1
for d in %s; do mount --bind -o ro "/$d" "$r/$d"; done
mount --bind /dev "$r/dev"
mount --bind /proc "$r/proc"
exec chroot "$r" /bin/sh -c 'echo ready; exec cat >/dev/null'
`

// cdScript starts a command in a directory of the jail.
const cdScript = `cd -- "$1" || exit 126; shift; exec "$@"`

// The holder lives until its stdin closes: when the jail is closed, or
// when the fake's process dies (no Pdeathsig: Go delivers it when the
// forking thread exits, which need not be the process).
type jail struct {
	holder *exec.Cmd
	stdin  io.Closer
	pid    string
}

// startJail lays out root's mount points and starts its holder.
func startJail(root string) (*jail, error) {
	if err := prepareJailRoot(root); err != nil {
		return nil, err
	}
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf(holderScript, strings.Join(jailBind, " ")), "sh", root)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Unshareflags: syscall.CLONE_NEWNS, // Go also makes "/" private in it
		Setpgid:      true,
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// "ready" comes from inside the chroot: nsenter -r takes the holder's
	// root, so it must have switched before the first command enters.
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("jail holder: %v: %s", err, stderr.String())
	}
	return &jail{holder: cmd, stdin: in, pid: strconv.Itoa(cmd.Process.Pid)}, nil
}

// command runs cmd with args in the jail, starting in cwd (a sandbox
// path). nsenter execs without forking, so the pid is the command's.
func (j *jail) command(cwd, cmd string, args []string) *exec.Cmd {
	argv := append([]string{"-t", j.pid, "-m", "-r", "-w", "/bin/sh", "-c", cdScript, "sh", cwd, cmd}, args...)
	c := exec.Command(nsenter, argv...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return c
}

func (j *jail) close() {
	_ = j.stdin.Close()
	_ = syscall.Kill(-j.holder.Process.Pid, syscall.SIGKILL)
	_ = j.holder.Wait()
}

// prepareJailRoot lays out the mount points and symlinks in a sandbox
// root.
func prepareJailRoot(root string) error {
	for _, d := range append(append([]string{}, jailBind...), "dev", "proc") {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	for name, target := range jailLinks {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	tmp := filepath.Join(root, "tmp")
	if err := os.MkdirAll(tmp, 0o777); err != nil {
		return err
	}
	return os.Chmod(tmp, 0o777|os.ModeSticky)
}

// JailAvailable reports whether this process can run commands in jails
// (root on Linux with mount, chroot and nsenter). Without jails commands
// see host paths, which a conformance run cannot accept.
func JailAvailable() bool { return jailAvailable() }

// jailAvailable probes once whether this process can build jails.
func jailAvailable() bool {
	jailOnce.Do(func() {
		if os.Geteuid() != 0 {
			return
		}
		var err error
		if nsenter, err = exec.LookPath("nsenter"); err != nil {
			return
		}
		for _, name := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc"} {
			fi, err := os.Lstat("/" + name)
			switch {
			case err != nil:
			case fi.Mode()&os.ModeSymlink != 0:
				if t, err := os.Readlink("/" + name); err == nil && !strings.HasPrefix(t, "/") {
					jailLinks[name] = t
				}
			case fi.IsDir():
				jailBind = append(jailBind, name)
			}
		}
		dir, err := os.MkdirTemp("", "e2bfake-jailprobe-")
		if err != nil {
			return
		}
		defer os.RemoveAll(dir)
		j, err := startJail(dir)
		if err != nil {
			return
		}
		defer j.close()
		out, err := j.command("/tmp", "/bin/sh", []string{"-c", "pwd"}).Output()
		jailOK = err == nil && string(out) == "/tmp\n"
	})
	return jailOK
}
