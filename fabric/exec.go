package fabric

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/wasi"
)

// Execution: an attempt activated with the runc executor gets one
// container whose root is the attempt's overlay root, started after the
// mount and stopped before the unmount; suspend freezes it for the seal.
// The container's id is the attempt's id, so a restarted daemon finds its
// containers again (Recover).

// ExecutorRunc names the OCI/Linux executor.
const ExecutorRunc = "runc"

// ContainerConfig is what an attempt's container runs with. It is pinned in
// the attempt's runtime record (to restart it) and in the provenance of
// nodes the attempt seals (the environment of FR-10).
type ContainerConfig struct {
	Env     []string         `json:"env,omitempty"`
	Workdir string           `json:"workdir,omitempty"`
	User    string           `json:"user,omitempty"` // UID:GID
	Limits  executor.Limits  `json:"limits"`
	Network string           `json:"network"` // "none": a namespace with loopback only
	Mounts  []executor.Mount `json:"mounts,omitempty"`
	CapAdd  []string         `json:"cap_add,omitempty"` // capabilities given back (executor.Spec.CapAdd)
}

// provenance is c as a sealed node's provenance pins it: the environment
// the attempt ran in, with a bind mount named by where the container saw
// it, not by the operator's host path (worker-local truth, which durable
// state does not hold).
func (c *ContainerConfig) provenance() any {
	if c == nil {
		return nil
	}
	type mount struct {
		Destination string `json:"destination"`
		ReadOnly    bool   `json:"read_only,omitempty"`
	}
	// The environment is pinned by the names of its variables: their values
	// may be secrets (API keys handed to a sandbox), and provenance is
	// exported, shown and kept with every node sealed from the attempt.
	p := struct {
		ContainerConfig
		Env    []string `json:"env,omitempty"`
		Mounts []mount  `json:"mounts,omitempty"`
	}{ContainerConfig: *c}
	for _, kv := range c.Env {
		name, _, _ := strings.Cut(kv, "=")
		p.Env = append(p.Env, name)
	}
	for _, m := range c.Mounts {
		p.Mounts = append(p.Mounts, mount{Destination: m.Destination, ReadOnly: m.ReadOnly})
	}
	return p
}

func (c ContainerConfig) spec(rootfs string) (executor.Spec, error) {
	s := executor.Spec{Rootfs: rootfs, Env: c.Env, Workdir: c.Workdir, Limits: c.Limits, Mounts: c.Mounts, CapAdd: c.CapAdd}
	if c.User != "" {
		u, err := executor.ParseUser(c.User)
		if err != nil {
			return s, err
		}
		s.User = u
	}
	return s, s.Validate()
}

// startContainer starts a runc attempt's container on its mounted root,
// unless it already runs (a replayed activation, an adopted attempt).
func (f *Fabric) startContainer(ctx context.Context, a journal.Attempt) error {
	// The attempt now holds its container (or has none): the pool may
	// have only the room that is left (quota.changed).
	defer f.quota.changed()
	if a.Executor != ExecutorRunc {
		return nil
	}
	if f.exec == nil {
		return fmt.Errorf("attempt %s: no runc executor configured: %w", a.AttemptID, journal.ErrUnsupported)
	}
	v, err := f.attemptView(ctx, a.AttemptID)
	if err != nil {
		return err
	}
	if v.Runtime == nil {
		return fmt.Errorf("attempt %s is not mounted: %w", a.AttemptID, journal.ErrFailedPrecondition)
	}
	if info, err := f.exec.State(ctx, a.AttemptID); err == nil && info.Status != executor.StatusStopped {
		return nil
	}
	d, err := runtimeData(v.Runtime)
	if err != nil {
		return err
	}
	cfg := ContainerConfig{Network: "none"}
	if d.Container != nil {
		cfg = *d.Container
	}
	spec, err := cfg.spec(v.Runtime.Mount)
	if err != nil {
		return err
	}
	return f.exec.Start(ctx, a.AttemptID, spec)
}

// stopContainer stops an attempt's container if it has one.
func (f *Fabric) stopContainer(ctx context.Context, a journal.Attempt) error {
	if a.Executor != ExecutorRunc || f.exec == nil {
		return nil
	}
	return f.exec.Stop(ctx, a.AttemptID)
}

// ExecRequest runs one command in an attempt.
type ExecRequest struct {
	AttemptID string   `json:"attempt_id"`
	Args      []string `json:"args"`
	Env       []string `json:"env,omitempty"`
	Workdir   string   `json:"workdir,omitempty"`
	User      string   `json:"user,omitempty"`
	TTY       bool     `json:"tty,omitempty"`
	Rows      uint16   `json:"rows,omitempty"`
	Cols      uint16   `json:"cols,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"`
	// TimeoutMillis kills the command after that long (deadline_exceeded).
	TimeoutMillis int64 `json:"timeout_ms,omitempty"`
	// For wasi attempts: Module runs a module stored in the CAS (hex id)
	// instead of Args[0] read from the root; MemoryLimitPages caps its
	// linear memory (64 KiB pages).
	Module           string `json:"module,omitempty"`
	MemoryLimitPages uint32 `json:"memory_limit_pages,omitempty"`
}

// ExecStreams connect a command to its caller.
type ExecStreams struct {
	Stdout, Stderr io.Writer
	// Started is called once the process runs, with its stdin (nil unless
	// requested) and a resize function (nil without a TTY).
	Started func(stdin io.WriteCloser, resize func(rows, cols uint16) error)
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int   `json:"exit_code"`
	Millis   int64 `json:"ms"`
	// OOMKilled: the kernel's OOM killer ended the command (exit 137)
	// because the attempt hit its memory limit.
	OOMKilled bool `json:"oom_killed,omitempty"`
}

// Exec runs a command in a live runc attempt. The command ends on its own,
// at its timeout, or when ctx ends (a client that disconnects); in the last
// two cases it and its descendants are killed and the error wraps
// context.DeadlineExceeded or context.Canceled (deadline_exceeded).
func (f *Fabric) Exec(ctx context.Context, req ExecRequest, streams ExecStreams) (ExecResult, error) {
	if err := journal.CheckID(journal.KindAttempt, req.AttemptID); err != nil {
		return ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	if req.TimeoutMillis < 0 {
		return ExecResult{}, fmt.Errorf("exec: negative timeout: %w", journal.ErrInvalidArgument)
	}
	// A queued attempt that is being started is active in the journal
	// before its root is mounted and its container runs: startQueued
	// holds the attempt's lock from that commit until the container is
	// up. Wait for it to finish, so that an exec right after the attempt
	// turned active finds its container (not a not_found).
	f.lockAttempt(req.AttemptID)()
	a, err := f.attemptView(ctx, req.AttemptID)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	if a.State != journal.AttemptActive {
		return ExecResult{}, fmt.Errorf("exec: attempt %s is %s: %w", a.AttemptID, a.State, journal.ErrFailedPrecondition)
	}
	if a.Executor == ExecutorWASI {
		return f.runWASI(ctx, a, req, streams)
	}
	if a.Executor != ExecutorRunc || f.exec == nil {
		return ExecResult{}, fmt.Errorf("exec: attempt %s runs executor %q, which takes no commands: %w", a.AttemptID, a.Executor, journal.ErrUnsupported)
	}
	spec := executor.ExecSpec{Args: req.Args, Env: req.Env, Workdir: req.Workdir, TTY: req.TTY, Stdin: req.Stdin,
		Size: executor.WinSize{Rows: req.Rows, Cols: req.Cols}, Stdout: streams.Stdout, Stderr: streams.Stderr}
	if req.User != "" {
		u, err := executor.ParseUser(req.User)
		if err != nil {
			return ExecResult{}, fmt.Errorf("exec: %w", err)
		}
		spec.User = &u
	}
	if err := spec.Validate(); err != nil {
		return ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	if req.TimeoutMillis > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMillis)*time.Millisecond)
		defer cancel()
	}
	start := time.Now()
	p, err := f.exec.Exec(ctx, a.AttemptID, spec)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec: %w", err)
	}
	if streams.Started != nil {
		var resize func(rows, cols uint16) error
		if req.TTY {
			resize = func(rows, cols uint16) error { return p.Resize(executor.WinSize{Rows: rows, Cols: cols}) }
		}
		streams.Started(p.Stdin(), resize)
	}
	code, err := p.Wait()
	res := ExecResult{ExitCode: code, Millis: time.Since(start).Milliseconds()}
	if o, ok := p.(executor.OOMReporter); ok {
		res.OOMKilled = o.OOMKilled()
	}
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	return res, nil
}

// ExecutorWASI names the WebAssembly executor.
const ExecutorWASI = "wasi"

// runWASI runs a module against a wasi attempt's root: the module is read
// from the root (Args[0]) or from the store (req.Module), and writes land
// in the attempt's delta like any other.
func (f *Fabric) runWASI(ctx context.Context, a AttemptView, req ExecRequest, streams ExecStreams) (ExecResult, error) {
	if f.wasm == nil {
		return ExecResult{}, fmt.Errorf("exec: this daemon has no WASI runtime: %w", journal.ErrUnsupported)
	}
	if req.TTY {
		// A module sees stdio as plain streams: there is no terminal to
		// give it, whatever the request.
		return ExecResult{}, fmt.Errorf("exec: WASI modules run without a terminal (tty): %w", journal.ErrUnsupported)
	}
	if req.User != "" || req.Workdir != "" {
		return ExecResult{}, fmt.Errorf("exec: WASI modules take no user or workdir: %w", journal.ErrInvalidArgument)
	}
	if len(req.Args) == 0 && req.Module == "" {
		return ExecResult{}, fmt.Errorf("exec: no module: %w", journal.ErrInvalidArgument)
	}
	var mod []byte
	var err error
	if req.Module != "" {
		id, perr := cas.ParseID(req.Module)
		if perr != nil {
			return ExecResult{}, fmt.Errorf("exec: module: %w", perr)
		}
		info, serr := f.store.Stat(ctx, id)
		if serr != nil {
			return ExecResult{}, fmt.Errorf("exec: module: %w", serr)
		}
		if info.Size > wasi.MaxModuleSize {
			return ExecResult{}, fmt.Errorf("exec: module of %d bytes: %w", info.Size, journal.ErrInvalidArgument)
		}
		mod, err = cas.ReadAll(ctx, f.store, id)
	} else {
		mod, err = wasi.ReadModule(a.Root, req.Args[0])
	}
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec: module: %w", err)
	}
	args := req.Args
	if len(args) == 0 {
		args = []string{req.Module}
	}
	spec := wasi.Spec{Module: mod, Args: args, Env: req.Env, Stdout: streams.Stdout, Stderr: streams.Stderr,
		Root: a.Root, MemoryLimitPages: req.MemoryLimitPages}
	if req.Stdin {
		pr, pw := io.Pipe()
		defer pr.Close()
		spec.Stdin = pr
		if streams.Started != nil {
			streams.Started(pw, nil)
		}
	} else if streams.Started != nil {
		streams.Started(nil, nil)
	}
	if req.TimeoutMillis > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMillis)*time.Millisecond)
		defer cancel()
	}
	res, err := f.wasm.Run(ctx, spec)
	out := ExecResult{ExitCode: res.ExitCode, Millis: res.Duration.Milliseconds()}
	if err != nil {
		return out, fmt.Errorf("exec: %w", err)
	}
	return out, nil
}

// Usage is what a live runc attempt's container has used (its cgroup).
func (f *Fabric) Usage(ctx context.Context, attemptID string) (executor.Usage, error) {
	if err := journal.CheckID(journal.KindAttempt, attemptID); err != nil {
		return executor.Usage{}, fmt.Errorf("usage: %w", err)
	}
	a, err := f.attemptView(ctx, attemptID)
	if err != nil {
		return executor.Usage{}, fmt.Errorf("usage: %w", err)
	}
	if a.State != journal.AttemptActive || a.Executor != ExecutorRunc {
		return executor.Usage{}, fmt.Errorf("usage: attempt %s is %s %s, not a running container: %w", a.AttemptID, a.State, a.Executor, journal.ErrFailedPrecondition)
	}
	r, ok := f.exec.(executor.UsageReporter)
	if !ok {
		return executor.Usage{}, fmt.Errorf("usage: the executor reports no usage: %w", journal.ErrUnsupported)
	}
	return r.Usage(ctx, attemptID)
}
