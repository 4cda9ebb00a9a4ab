package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
)

// Proc is one supervised process. Set Args (and Env, LogFile) before Start;
// Args may be changed between a Kill and the next Start.
type Proc struct {
	Args    []string
	Env     []string // nil: the test process's environment
	LogFile string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts the process; its output is appended to LogFile.
func (p *Proc) Start() error {
	log, err := os.OpenFile(p.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(p.Args[0], p.Args[1:]...)
	cmd.Env = p.Env
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, and killed with the test process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", filepath.Base(p.Args[0]), err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	return nil
}

// Running reports whether the process runs.
func (p *Proc) Running() bool {
	started, gone := p.state()
	return started && !gone
}

// Exited reports whether the process was started and has ended.
func (p *Proc) Exited() bool {
	started, gone := p.state()
	return started && gone
}

func (p *Proc) state() (started, gone bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false, false
	}
	select {
	case <-p.exited:
		return true, true
	default:
		return true, false
	}
}

// Kill ends the process with SIGKILL and waits for it; a no-op before Start.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Log is what the process wrote so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogFile)
	return string(b)
}

// Tail is the end of Log, short enough for an error message.
func (p *Proc) Tail() string {
	s := p.Log()
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return s
}
