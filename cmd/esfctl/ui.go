package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/ui"
)

func (a *app) uiCommand() *cli.Command {
	return &cli.Command{
		Name:  "ui",
		Usage: "serve the web view of groups, search trees, nodes, diffs and files on loopback",
		Description: "Prints a URL with a random token and serves until interrupted; requests\n" +
			"without the token are refused. Open the URL in a browser on this machine.\n" +
			"The view reaches esfd as every other verb does (--socket or --host), follows\n" +
			"the event stream, and forks, promotes and prunes after a confirmation.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Usage: "loopback address to listen on (port 0: any free port)", Value: "127.0.0.1:0"},
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 0); err != nil {
				return err
			}
			// Fail now, not in the browser, when esfd cannot be reached.
			if _, err := a.client.Status(ctx); err != nil {
				return err
			}
			srv, err := ui.New(a.client, ui.Options{})
			if err != nil {
				return err
			}
			ln, err := ui.ListenLoopback(cmd.String("addr"))
			if err != nil {
				return err
			}
			u := srv.URL(ln.Addr())
			if a.json {
				if err := a.printJSON(map[string]string{"url": u}); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(a.stdout, "esf view: %s\n(interrupt to stop)\n", u)
			}
			return srv.Serve(ctx, ln)
		}),
	}
}
