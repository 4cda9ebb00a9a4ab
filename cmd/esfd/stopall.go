package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/fabric"
)

// stopAllCommand is the full teardown that a daemon's SIGTERM deliberately
// is not: release every live attempt (unmount its root, drop its unsealed
// delta) and stop the projection server. It takes the state lock, so it
// runs only while no esfd does.
func stopAllCommand() *cli.Command {
	return &cli.Command{
		Name:  "stop-all",
		Usage: "release every attempt and stop the projection server (esfd must be stopped first)",
		Description: "A stopped esfd leaves live attempts mounted and the projection server running,\n" +
			"for the next esfd to adopt. stop-all ends them: each live attempt is released\n" +
			"(its unsealed changes are lost) and the projection is unmounted. It waits for\n" +
			"the projection server process to exit.",
		Flags:  append([]cli.Flag{stateFlag(), logLevelFlag()}, journalFlags()...),
		Action: stopAll,
	}
}

func stopAll(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Len() > 0 {
		return fmt.Errorf("stop-all: unexpected arguments %q", cmd.Args().Slice())
	}
	log, err := newLogger(cmd.String("log-level"))
	if err != nil {
		return err
	}
	routeContainerdLog(log)
	state, err := filepath.Abs(cmd.String("state"))
	if err != nil {
		return err
	}
	// The executor too: live runc attempts' containers must stop before
	// their roots can be unmounted.
	opts := fabric.Options{StateDir: state, Logger: log}
	// Stop needs no id range: it unmounts whatever a container had.
	if ex, err := runcExecutor(state, "", runc.IDRange{}, log); err == nil {
		opts.Executor = ex
		// The idle containers of the warm pool a daemon left.
		defer func() {
			if err := ex.ClosePool(context.WithoutCancel(ctx)); err != nil {
				log.Warn("runc pool", "err", err)
			}
		}()
	}
	if opts.JournalStore, err = openJournal(ctx, cmd, log); err != nil {
		return err
	}
	// On a shared graph, stop-all acts as the worker (--worker) and only
	// on its attempts: it registers under that id, holding the state dir's
	// lock first, so it takes the id back at once from a dead esfd of this
	// state dir.
	if opts.StateLock, err = fabric.LockState(state); err != nil {
		if opts.JournalStore != nil {
			opts.JournalStore.Close()
		}
		return err
	}
	if opts.Cluster, err = registerWorker(ctx, cmd, opts.JournalStore, 0, opts.StateLock.ID(), log); err != nil {
		opts.StateLock.Close()
		opts.JournalStore.Close()
		return err
	}
	f, err := fabric.Open(ctx, opts)
	if err != nil {
		if opts.Cluster != nil {
			opts.Cluster.Registration.Close()
		}
		if opts.JournalStore != nil {
			opts.JournalStore.Close()
		}
		return err
	}
	defer f.Close()
	if opts.Cluster != nil {
		defer opts.Cluster.Registration.Close()
	}
	pid := projectionPid(state)
	if err := f.StopAll(ctx); err != nil {
		return fmt.Errorf("stop-all: %w", err)
	}
	// fabric stops the projection by unmounting it; the server process
	// ends on its own right after. Wait for it, so that "stopped" means no
	// process is left.
	if pid > 0 && !waitExit(pid, 10*time.Second) {
		return fmt.Errorf("stop-all: projection server pid %d still running 10s after its unmount", pid)
	}
	log.Info("stopped all", "state_dir", state)
	return nil
}

// projectionPid is the pid of a running projection server of state, or 0.
// The pid file may be stale: a pid counts only if that process is an esfd
// fuse-server of this state dir.
func projectionPid(state string) int {
	b, err := os.ReadFile(filepath.Join(state, "fuse-server.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	isServer, ofState := false, false
	for i, a := range args {
		isServer = isServer || a == "fuse-server"
		ofState = ofState || a == "--state" && i+1 < len(args) && args[i+1] == state
	}
	if !isServer || !ofState {
		return 0
	}
	return pid
}

// waitExit waits until pid is gone (or a zombie nobody reaped yet).
func waitExit(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if syscall.Kill(pid, 0) != nil || zombie(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z'
}
