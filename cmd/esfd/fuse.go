package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v3"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/cas/tier"
	"github.com/esf-dev/esf/fusefs"
)

// fuseServerCommand is the projection server: esfd starts it (see
// fabric.Options.ProjectionCommand) in its own session, so it outlives the
// daemon and live attempts keep their lower layer across a restart. It
// reads the object store and nothing else: no journal, no state lock (the
// daemon holds that).
func fuseServerCommand() *cli.Command {
	return &cli.Command{
		Name:   "fuse-server",
		Usage:  "serve the read-only projection of <state>/cas at <state>/mnt (started by esfd)",
		Hidden: true,
		Flags:  []cli.Flag{stateFlag(), logLevelFlag(), casRemoteFlag()},
		Action: fuseServer,
	}
}

func fuseServer(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Len() > 0 {
		return fmt.Errorf("fuse-server: unexpected arguments %q", cmd.Args().Slice())
	}
	log, err := newLogger(cmd.String("log-level"))
	if err != nil {
		return err
	}
	state, err := filepath.Abs(cmd.String("state"))
	if err != nil {
		return err
	}
	// The daemon owns the store's housekeeping: a reader never removes
	// temp files (they may be a live Put of the daemon's).
	store, err := local.Open(filepath.Join(state, "cas"), &local.Options{StaleTempAge: -1})
	if err != nil {
		return err
	}
	var getter fusefs.PathStore = store
	remote, err := openRemote(ctx, cmd, state, log)
	if err != nil {
		return err
	}
	if remote != nil {
		// Misses fetch into the cache the daemon shares; the daemon's
		// writes already went through to the remote.
		if getter, err = tier.New(tier.Options{Local: store, Remote: remote, Logger: log}); err != nil {
			return err
		}
	}
	fsys, err := fusefs.New(fusefs.Options{Store: getter, Logger: log,
		OnCorrupt: fusefs.AppendCorruptLog(filepath.Join(state, fusefs.CorruptLogName), log)})
	if err != nil {
		return err
	}
	mnt := filepath.Join(state, "mnt")
	log.Info("projection server starting", "mount", mnt, "pid", os.Getpid())
	// SIGTERM or SIGINT (main's ctx) unmounts, unless attempts still stack
	// on the projection: then Serve keeps serving (a second signal kills).
	if err := fusefs.Serve(ctx, mnt, fsys, readyPipe()); err != nil {
		log.Error("projection server failed", "err", err)
		return err
	}
	log.Info("projection server stopped", "mount", mnt)
	return nil
}

// readyPipe is fd 3, where the starting daemon waits for "ready", or nil
// when the server was started by hand without it.
func readyPipe() io.Writer {
	if _, err := unix.FcntlInt(3, unix.F_GETFD, 0); err != nil {
		return nil
	}
	return os.NewFile(3, "ready")
}
