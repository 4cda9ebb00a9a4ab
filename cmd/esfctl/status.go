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
			rows := [][2]string{
				{"version", st.Version},
				{"state_dir", st.StateDir},
				{"socket", a.socket},
				{"objects", fmt.Sprint(st.Objects)},
				{"bytes", fmt.Sprintf("%d (%s)", st.Bytes, humanBytes(st.Bytes))},
			}
			if r := st.Remote; r != nil {
				queue := fmt.Sprintf("%d objects in %d writes", r.QueueObjects, r.QueueFiles)
				if r.QueueError != "" {
					queue += "; last error: " + r.QueueError
				}
				rows = append(rows,
					[2]string{"remote", r.Location},
					[2]string{"durability", r.Durability},
					[2]string{"upload_queue", queue},
					[2]string{"fetched", fmt.Sprintf("%d objects (%s)", r.Fetches, humanBytes(r.FetchedBytes))},
					[2]string{"uploaded", fmt.Sprintf("%d objects (%s)", r.Uploads, humanBytes(r.UploadedBytes))})
			}
			a.table(rows)
			return nil
		}),
	}
}
