package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/urfave/cli/v3"

	v1 "github.com/esf-dev/esf/api/v1"
)

func (a *app) eventsCommand() *cli.Command {
	return &cli.Command{
		Name:      "events",
		Usage:     "print the event log as JSON lines, oldest first",
		ArgsUsage: "[--follow] [--group G] [--after N]",
		Description: "Every transition of the graph is an event with its group, node, attempt, root,\n" +
			"lease and trace ids. The output is one JSON object per line whatever -o says.\n" +
			"--after N starts after event seq N (to resume, pass the last seq seen).\n" +
			"--follow waits for new events until interrupted (then exits 0); if the daemon\n" +
			"stops, it exits 11 (unavailable) and can be resumed with --after.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing events as they happen"},
			&cli.StringFlag{Name: "group", Usage: "only events of this group"},
			&cli.StringFlag{Name: "node", Usage: "only events of this node"},
			&cli.StringFlag{Name: "attempt", Usage: "only events of this attempt"},
			&cli.StringSliceFlag{Name: "type", Usage: "only events of this type, e.g. node.forked or node.* (repeatable)"},
			&cli.Uint64Flag{Name: "after", Usage: "only events with a larger seq"},
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 0); err != nil {
				return err
			}
			q := v1.EventsQuery{After: cmd.Uint64("after"), GroupID: cmd.String("group"), NodeID: cmd.String("node"),
				AttemptID: cmd.String("attempt"), Types: cmd.StringSlice("type"), Follow: cmd.Bool("follow")}
			err := a.client.Events(ctx, q, func(ev v1.Event) error {
				b, err := json.Marshal(ev)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.stdout, "%s\n", b)
				return err
			})
			if q.Follow && ctx.Err() != nil {
				return nil // interrupted: the normal end of a follow
			}
			return err
		}),
	}
}
