// Command esfd is the esf daemon: it opens the state dir and serves the
// HTTP/JSON API on a unix socket until SIGTERM or SIGINT.
//
// The binary is also the entry point of esfd's helper processes (the FUSE
// projection server runs as a child process of the same binary, `esfd
// fuse-server`): each one is a hidden subcommand of root, and the root
// action is the daemon itself. `esfd stop-all` is the operator's full
// teardown of what a stopped daemon deliberately leaves running (live
// attempts' mounts and the projection server, which the next daemon adopts).
//
// Wiring: fabric.Open with the projection command, Recover (adopt or fail
// the attempts a previous daemon left), the API on the socket, and the
// reapers (ExpireLeases every second, ExpireIdempotencyKeys every minute)
// that stop before the fabric closes.
// containerd's logrus logger is routed into the daemon's slog handler.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/fabric"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// After the first signal, restore the default action: a second one
	// kills the daemon instead of waiting for the grace period.
	context.AfterFunc(ctx, stop)

	if err := root().Run(ctx, os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "esfd: %v\n", err)
		os.Exit(1)
	}
}

func root() *cli.Command {
	return &cli.Command{
		Name:    "esfd",
		Usage:   "the Ephemeral Sandbox Fabric daemon",
		Version: fabric.Version,
		Description: "esfd keeps an immutable graph of filesystem checkpoints in a content-addressed\n" +
			"store and serves the HTTP/JSON API of docs/openapi.yaml on a unix socket (mode 0600).\n" +
			"esfctl is its client. SIGTERM or SIGINT shut it down gracefully; a second signal\n" +
			"stops it at once. Live attempts stay mounted and the projection server (a child\n" +
			"process, `esfd fuse-server`) keeps running across a restart: the next esfd on the\n" +
			"same state adopts them. `esfd stop-all --state DIR` tears them down.",
		Flags:           serveFlags(),
		Action:          serve,
		HideHelpCommand: true,
		// Helper processes of the daemon, started by esfd itself (never by
		// users), are hidden subcommands here; stop-all is for operators.
		Commands: []*cli.Command{
			fuseServerCommand(),
			stopAllCommand(),
		},
	}
}
