package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/fabric"
)

const defaultState = "/var/lib/esf"

func serveFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{
			Name:    "state",
			Usage:   "state directory (object store, journal, mounts)",
			Value:   defaultState,
			Sources: cli.EnvVars("ESF_STATE"),
		},
		&cli.StringFlag{
			Name:    "socket",
			Usage:   "unix socket of the API (default: <state>/esfd.sock)",
			Sources: cli.EnvVars("ESF_SOCKET"),
		},
		&cli.StringFlag{
			Name:    "log-level",
			Usage:   "debug, info, warn or error",
			Value:   "info",
			Sources: cli.EnvVars("ESF_LOG_LEVEL"),
		},
		&cli.DurationFlag{
			Name:  "shutdown-grace",
			Usage: "how long in-flight requests may run after SIGTERM",
			Value: 30 * time.Second,
		},
	}
}

func serve(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments %q (see esfd --help)", cmd.Args().Slice())
	}
	log, err := newLogger(cmd.String("log-level"))
	if err != nil {
		return err
	}
	state := cmd.String("state")
	socket := cmd.String("socket")
	if socket == "" {
		socket = filepath.Join(state, "esfd.sock")
	}

	f, err := fabric.Open(ctx, fabric.Options{StateDir: state, Logger: log})
	if err != nil {
		return err
	}
	defer f.Close()
	ln, err := api.Listen(socket)
	if err != nil {
		return err
	}
	log.Info("listening", "socket", socket, "state_dir", f.StateDir(), "version", fabric.Version, "pid", os.Getpid())
	srv := api.NewServer(f, api.ServerOptions{Logger: log})
	if err := srv.Serve(ctx, ln, cmd.Duration("shutdown-grace")); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

// newLogger builds the daemon's only slog handler: JSON lines on stderr.
func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToLower(level))); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
