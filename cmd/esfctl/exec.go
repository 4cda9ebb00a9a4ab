package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

func (a *app) execCommand() *cli.Command {
	return &cli.Command{
		Name:      "exec",
		Usage:     "run a command in an active attempt",
		ArgsUsage: "ATTEMPT [flags] -- CMD [ARGS...]",
		Description: "Runs CMD in the attempt's container (runc) or, for a wasi attempt, the\n" +
			"module CMD names in its root (or --module). Its stdout and stderr are\n" +
			"copied here as they come. esfctl exits with the command's exit status\n" +
			"(128+N when signal N killed it), or 8 (deadline_exceeded) when --timeout\n" +
			"killed it. Interrupting esfctl kills the command. stdout is the command's:\n" +
			"-o json changes only how esfctl's own errors are printed.",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "timeout", Usage: "kill the command after this long (0: never)"},
			&cli.StringSliceFlag{Name: "env", Usage: "K=V to add to the command's environment (repeatable)"},
			&cli.StringFlag{Name: "workdir", Usage: "working directory of the command, inside the attempt"},
			&cli.StringFlag{Name: "user", Usage: "UID:GID to run as"},
			&cli.StringFlag{Name: "module", Usage: "for wasi attempts: run this stored module (blob id) instead"},
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			args := cmd.Args().Slice()
			if len(args) < 1 {
				return fmt.Errorf("exec: want ATTEMPT -- CMD [ARGS...]: %w", errdefs.ErrInvalidArgument)
			}
			req := fabric.ExecRequest{AttemptID: args[0], Args: args[1:], Workdir: cmd.String("workdir"),
				User: cmd.String("user"), Module: cmd.String("module")}
			if len(req.Args) == 0 && req.Module == "" {
				return fmt.Errorf("exec: no command after the attempt: %w", errdefs.ErrInvalidArgument)
			}
			if len(req.Args) == 0 {
				req.Args = nil
			}
			for _, kv := range cmd.StringSlice("env") {
				if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
					return fmt.Errorf("exec --env %q: want K=V: %w", kv, errdefs.ErrInvalidArgument)
				}
				req.Env = append(req.Env, kv)
			}
			if d := cmd.Duration("timeout"); d < 0 {
				return fmt.Errorf("exec --timeout %s: negative: %w", d, errdefs.ErrInvalidArgument)
			} else if d > 0 {
				req.TimeoutMillis = max(d.Milliseconds(), 1)
			}
			res, err := a.client.Exec(ctx, req, a.stdout, a.stderr)
			if err != nil {
				return err
			}
			a.exitCode = res.ExitCode
			return nil
		}),
	}
}
