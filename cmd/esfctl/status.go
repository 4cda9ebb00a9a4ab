package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"
)

func (a *app) statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show the daemon's version, state dir and object store",
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 0); err != nil {
				return err
			}
			st, err := a.client.Status(ctx)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(st)
			}
			a.table([][2]string{
				{"version", st.Version},
				{"state_dir", st.StateDir},
				{"socket", a.socket},
				{"objects", fmt.Sprint(st.Objects)},
				{"bytes", fmt.Sprintf("%d (%s)", st.Bytes, humanBytes(st.Bytes))},
			})
			return nil
		}),
	}
}
