package main

import (
	"context"
	"fmt"
	"text/tabwriter"

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

func (a *app) workersCommand() *cli.Command {
	return &cli.Command{
		Name:  "workers",
		Usage: "list the workers of the graph (several esfd on one etcd journal) and their load",
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 0); err != nil {
				return err
			}
			ws, err := a.client.Workers(ctx)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(ws)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tADDR\tLIVE\tCAPACITY\t")
			for _, w := range ws.Workers {
				id, capa := w.ID, "-"
				if w.Self {
					id += " *"
				}
				if w.Capacity > 0 {
					capa = fmt.Sprint(w.Capacity)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t\n", id, w.Addr, w.Live, capa)
			}
			if ws.Fenced {
				fmt.Fprintln(tw, "(this worker lost its registration: it is fenced; restart it)")
			}
			return tw.Flush()
		}),
	}
}
