package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

func (a *app) fsckCommand() *cli.Command {
	return &cli.Command{
		Name:  "fsck",
		Usage: "re-hash every stored object; exit 9 (corrupt) listing the bad ones",
		Flags: []cli.Flag{idempotencyKeyFlag(), &cli.BoolFlag{
			Name:  "remote",
			Usage: "check the remote content store (esfd --cas-remote): every reachable object there and whole; missing ones exit 3 (not found)",
		}},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 0); err != nil {
				return err
			}
			res, err := a.client.FsckWith(ctx, v1.FsckRequest{Remote: cmd.Bool("remote")}, a.callOptions(cmd))
			if err != nil {
				return err
			}
			if a.json {
				if err := a.printJSON(res); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(a.stdout, "checked %d objects (%s)\n", res.Checked, humanBytes(res.Bytes))
				for _, id := range res.Bad {
					fmt.Fprintf(a.stdout, "corrupt %s\n", id)
				}
				for _, id := range res.Missing {
					fmt.Fprintf(a.stdout, "missing %s\n", id)
				}
			}
			if len(res.Bad) > 0 {
				return fmt.Errorf("%d corrupt object(s), first %s: %w", len(res.Bad), res.Bad[0], errdefs.ErrCorrupt)
			}
			if len(res.Missing) > 0 {
				return fmt.Errorf("%d object(s) missing from the remote, first %s: %w", len(res.Missing), res.Missing[0], errdefs.ErrNotFound)
			}
			return nil
		}),
	}
}
