//go:build linux

package osfake

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
)

// Commands run chrooted into their sandbox's root, so a command and execd's
// file API agree on every path. A root needs the host's system directories
// inside it, as bind mounts, and those must never exist in the host's mount
// namespace (a crashed test would leak them). So each Server starts one
// helper, the "zygote": the running binary re-executed (/proc/self/exe)
// with zygoteEnv set, which init below catches before anything else runs.
// It is born in a mount namespace of its own (CLONE_NEWNS, plus
// CLONE_NEWUSER when not root), binds /usr, /etc, /dev and /proc read-only
// into each sandbox root once, and starts every command as its child with a
// plain chroot. Its namespace, and every bind in it, dies with it. The
// server sends requests on the zygote's stdin and reads answers from its
// stdout, one JSON object per line.

const zygoteEnv = "OSFAKE_ZYGOTE"

type zygoteMsg struct {
	Op    string   `json:"op"` // prepare, release, spawn; prepared, released, started, exited
	ID    int64    `json:"id,omitempty"`
	Root  string   `json:"root,omitempty"`
	Binds []string `json:"binds,omitempty"`
	Cwd   string   `json:"cwd,omitempty"`
	Env   []string `json:"env,omitempty"`
	Cmd   string   `json:"cmd,omitempty"`
	Out   string   `json:"out,omitempty"` // stdout file (host path)
	Err   string   `json:"errf,omitempty"`
	UID   *uint32  `json:"uid,omitempty"`
	GID   *uint32  `json:"gid,omitempty"`
	Pid   int      `json:"pid,omitempty"`
	// Status is the wait status of an exited command.
	Status uint32 `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
}

func init() {
	if _, ok := os.LookupEnv(zygoteEnv); !ok {
		return
	}
	os.Unsetenv(zygoteEnv)
	if err := zygoteMain(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "osfake zygote: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func zygoteMain(in io.Reader, out io.Writer) error {
	// Nothing mounted here may propagate back to the host.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	reply := func(m zygoteMsg) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(m)
	}
	var wg sync.WaitGroup
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var m zygoteMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return err
		}
		switch m.Op {
		case "prepare":
			r := zygoteMsg{Op: "prepared", ID: m.ID}
			if err := bindInto(m.Root, m.Binds); err != nil {
				r.Error = err.Error()
			}
			reply(r)
		case "release":
			for _, d := range m.Binds {
				_ = syscall.Unmount(filepath.Join(m.Root, d), syscall.MNT_DETACH)
			}
			reply(zygoteMsg{Op: "released", ID: m.ID})
		case "spawn":
			cmd, files, err := zygoteCommand(m)
			if err == nil {
				err = cmd.Start()
			}
			for _, f := range files {
				f.Close()
			}
			if err != nil {
				reply(zygoteMsg{Op: "started", ID: m.ID, Error: err.Error()})
				continue
			}
			reply(zygoteMsg{Op: "started", ID: m.ID, Pid: cmd.Process.Pid})
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = cmd.Wait()
				r := zygoteMsg{Op: "exited", ID: m.ID}
				if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
					r.Status = uint32(ws)
				}
				reply(r)
			}()
		}
	}
	wg.Wait()
	return sc.Err()
}

// bindInto binds each host directory read-only at the same path under root.
func bindInto(root string, binds []string) error {
	for _, dir := range binds {
		target := filepath.Join(root, dir)
		if err := syscall.Mount(dir, target, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", dir, err)
		}
		// A remount may not drop flags the source is locked with (in a
		// user namespace), so they are carried over.
		flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
		var st syscall.Statfs_t
		if syscall.Statfs(dir, &st) == nil {
			for _, f := range []struct{ st, ms int64 }{
				{0x2, syscall.MS_NOSUID}, {0x4, syscall.MS_NODEV}, {0x8, syscall.MS_NOEXEC},
				{0x400, syscall.MS_NOATIME}, {0x800, syscall.MS_NODIRATIME}, {0x1000, syscall.MS_RELATIME},
			} {
				if st.Flags&f.st != 0 {
					flags |= uintptr(f.ms)
				}
			}
		}
		if err := syscall.Mount("", target, "", flags, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", dir, err)
		}
	}
	return nil
}

func zygoteCommand(m zygoteMsg) (*exec.Cmd, []*os.File, error) {
	var files []*os.File
	open := func(p string) (*os.File, error) {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err == nil {
			files = append(files, f)
		}
		return f, err
	}
	stdout, err := open(m.Out)
	if err != nil {
		return nil, files, err
	}
	stderr := stdout
	if m.Err != m.Out {
		if stderr, err = open(m.Err); err != nil {
			return nil, files, err
		}
	}
	cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", m.Cmd}, Env: m.Env, Dir: m.Cwd,
		Stdout: stdout, Stderr: stderr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: m.Root, Setpgid: true}
	if m.UID != nil {
		cred := &syscall.Credential{Uid: *m.UID, Gid: *m.UID}
		if m.GID != nil {
			cred.Gid = *m.GID
		}
		cmd.SysProcAttr.Credential = cred
	}
	return cmd, files, nil
}

// hostLayout is what every sandbox root gets from the host: directories to
// bind and symlinks to copy (a merged-/usr host has /bin -> usr/bin).
type hostLayout struct {
	binds []string
	links map[string]string
}

func probeHost() hostLayout {
	l := hostLayout{links: map[string]string{}}
	for _, name := range []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/dev", "/proc"} {
		fi, err := os.Lstat(name)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(name); err == nil {
				l.links[name] = target
			}
		case fi.IsDir():
			l.binds = append(l.binds, name)
		}
	}
	return l
}

// layOut prepares a new sandbox root on the host: mount points and
// symlinks.
func (l hostLayout) layOut(root string) error {
	for _, d := range l.binds {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	for name, target := range l.links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			return err
		}
	}
	return nil
}

// zygote is the server's handle on its helper.
type zygote struct {
	layout hostLayout
	cmd    *exec.Cmd
	stdin  io.WriteCloser

	mu      sync.Mutex
	enc     *json.Encoder
	next    int64
	waiting map[int64]chan zygoteMsg // prepare/release/spawn answers
	exits   map[int64]chan zygoteMsg // exited notices
	dead    error
	done    chan struct{} // the reader ended
}

// process is a started command: its pid (and process group) and a wait
// that reports how it ended.
type process struct {
	pid  int
	wait func() procExit
}

// procExit is how a command ended.
type procExit struct {
	code int    // exit code, -1 when a signal ended it (as os.ProcessState)
	text string // what Go's *exec.ExitError says ("exit status 3", "signal: killed")
}

func exitOf(ws syscall.WaitStatus) procExit {
	switch {
	case ws.Exited():
		return procExit{code: ws.ExitStatus(), text: fmt.Sprintf("exit status %d", ws.ExitStatus())}
	case ws.Signaled():
		t := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			t += " (core dumped)"
		}
		return procExit{code: -1, text: t}
	}
	return procExit{code: -1, text: fmt.Sprintf("wait status %#x", uint32(ws))}
}

func startZygote(layout hostLayout) (*zygote, error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Args[0] = "osfake-zygote"
	cmd.Env = []string{zygoteEnv + "=1"}
	cmd.Stderr = os.Stderr
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		attr.Unshareflags = syscall.CLONE_NEWNS
	} else {
		attr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
	cmd.SysProcAttr = attr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("osfake: start the sandbox helper: %w", err)
	}
	z := &zygote{layout: layout, cmd: cmd, stdin: stdin, enc: json.NewEncoder(stdin),
		waiting: map[int64]chan zygoteMsg{}, exits: map[int64]chan zygoteMsg{}, done: make(chan struct{})}
	go z.read(stdout)
	return z, nil
}

// read dispatches the zygote's answers until it exits; then everyone still
// waiting learns it is dead.
func (z *zygote) read(r io.Reader) {
	defer close(z.done)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var m zygoteMsg
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		z.mu.Lock()
		var ch chan zygoteMsg
		if m.Op == "exited" {
			ch = z.exits[m.ID]
			delete(z.exits, m.ID)
		} else {
			ch = z.waiting[m.ID]
			delete(z.waiting, m.ID)
		}
		z.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
	z.mu.Lock()
	z.dead = errors.New("osfake: the sandbox helper exited")
	for id, ch := range z.waiting {
		ch <- zygoteMsg{Error: z.dead.Error()}
		delete(z.waiting, id)
	}
	for id, ch := range z.exits {
		ch <- zygoteMsg{Op: "exited", Status: uint32(syscall.SIGKILL)}
		delete(z.exits, id)
	}
	z.mu.Unlock()
}

// call sends m and waits for its answer; exit, when not nil, is registered
// for the exited notice of a spawn.
func (z *zygote) call(m zygoteMsg, exit chan zygoteMsg) (zygoteMsg, error) {
	ch := make(chan zygoteMsg, 1)
	z.mu.Lock()
	if z.dead != nil {
		z.mu.Unlock()
		return zygoteMsg{}, z.dead
	}
	z.next++
	m.ID = z.next
	z.waiting[m.ID] = ch
	if exit != nil {
		z.exits[m.ID] = exit
	}
	err := z.enc.Encode(m)
	if err != nil {
		delete(z.waiting, m.ID)
		delete(z.exits, m.ID)
	}
	z.mu.Unlock()
	if err != nil {
		return zygoteMsg{}, err
	}
	r := <-ch
	if r.Error != "" {
		z.mu.Lock()
		delete(z.exits, m.ID)
		z.mu.Unlock()
		return r, errors.New(r.Error)
	}
	return r, nil
}

func (z *zygote) prepare(root string) error {
	_, err := z.call(zygoteMsg{Op: "prepare", Root: root, Binds: z.layout.binds}, nil)
	return err
}

func (z *zygote) release(root string) {
	_, _ = z.call(zygoteMsg{Op: "release", Root: root, Binds: z.layout.binds}, nil)
}

// spawn starts command chrooted in root.
func (z *zygote) spawn(root, cwd, command string, env []string, out, errf string, uid, gid *uint32) (*process, error) {
	exit := make(chan zygoteMsg, 1)
	r, err := z.call(zygoteMsg{Op: "spawn", Root: root, Cwd: cwd, Cmd: command, Env: env, Out: out, Err: errf, UID: uid, GID: gid}, exit)
	if err != nil {
		return nil, err
	}
	return &process{pid: r.Pid, wait: func() procExit { return exitOf(syscall.WaitStatus((<-exit).Status)) }}, nil
}

// stop ends the zygote (its commands must be dead already) and waits for it.
func (z *zygote) stop() {
	z.stdin.Close()
	<-z.done
	_ = z.cmd.Wait()
}
