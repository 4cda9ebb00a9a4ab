package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v3"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/size"
)

// The attempt verbs: activate, suspend, release, retry, lease renew, mount,
// umount.

// ttlMillis reads a --ttl duration flag as the API's ttl_ms; 0 when absent
// (the daemon's default).
func ttlMillis(cmd *cli.Command) (int64, error) {
	if !cmd.IsSet("ttl") {
		return 0, nil
	}
	d := cmd.Duration("ttl")
	if d < time.Millisecond {
		return 0, fmt.Errorf("--ttl %v: want at least 1ms: %w", d, errdefs.ErrInvalidArgument)
	}
	return d.Milliseconds(), nil
}

func ttlFlag(usage string) cli.Flag {
	return &cli.DurationFlag{Name: "ttl", Usage: usage}
}

func (a *app) printAttempt(raw []byte, v *v1.AttemptView) error {
	if a.json {
		return a.printRaw(raw)
	}
	a.table(attemptRows(v))
	return nil
}

func (a *app) activateCommand() *cli.Command {
	return &cli.Command{
		Name:  "activate",
		Usage: "lease a node for a new attempt and mount its private writable root",
		ArgsUsage: "NODE [--executor none|runc|wasi] [--ttl D] [--no-queue] [--worker ID]\n" +
			"      [--memory SIZE] [--pids N] [--cpus N] [--env K=V]... [--workdir DIR] [--user UID:GID]",
		Description: "NODE is a draft or sealed node. The attempt's root (printed as root) is an\n" +
			"overlay over the node's tree; write there, then suspend to seal the changes.\n" +
			"The lease expires after --ttl unless renewed (esfctl lease renew); an expired\n" +
			"attempt fails and its changes are dropped.\n\n" +
			"A runc attempt's container is limited by --memory, --pids and --cpus (each\n" +
			"defaults to the daemon's --default-memory, --default-pids, --default-cpus), and\n" +
			"its execs get --env, --workdir and --user as defaults. Its memory limit is also\n" +
			"what it reserves against the daemon's --max-memory. An attempt beyond the\n" +
			"daemon's quotas waits queued, or with --no-queue fails with quota_exceeded\n" +
			"(exit 7).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "executor", Usage: "executor of the attempt: none (a root to write in), runc (a container; see esfctl exec) or wasi", Value: v1.ExecutorNone},
			ttlFlag(fmt.Sprintf("lease time to live (default %v)", v1.DefaultLeaseTTL)),
			&cli.BoolFlag{Name: "no-queue", Usage: "fail with quota_exceeded instead of waiting when the daemon is at capacity"},
			&cli.StringFlag{Name: "memory", Usage: "memory limit, e.g. 512M or 2G (K, M, G, T: powers of 1024)"},
			&cli.StringFlag{Name: "disk", Usage: "limit on what the attempt may write (bytes and, through metadata, files), e.g. 1G (default: the daemon's --default-disk)"},
			&cli.Int64Flag{Name: "pids", Usage: "limit on processes and threads in the container"},
			&cli.Float64Flag{Name: "cpus", Usage: "CPU time per wall second, in CPUs (e.g. 1.5)"},
			&cli.StringSliceFlag{Name: "env", Usage: "K=V in every exec's environment (repeatable)"},
			&cli.StringFlag{Name: "workdir", Usage: "default working directory of execs, inside the attempt"},
			&cli.StringFlag{Name: "user", Usage: "default UID:GID of execs"},
			&cli.StringSliceFlag{Name: "cap-add", Usage: "give the container a capability dropped by default: CAP_FSETID, CAP_MKNOD, CAP_SETFCAP (repeatable)"},
			&cli.StringFlag{Name: "worker", Usage: "run the attempt on this worker of the graph (esfctl workers); default the least loaded one with capacity"},
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			ttl, err := ttlMillis(cmd)
			if err != nil {
				return err
			}
			req := v1.ActivateRequest{NodeID: cmd.Args().First(), Executor: cmd.String("executor"), TTLMillis: ttl,
				NoQueue: cmd.Bool("no-queue"), Pids: cmd.Int64("pids"), CPUs: cmd.Float64("cpus"),
				Workdir: cmd.String("workdir"), User: cmd.String("user"), CapAdd: cmd.StringSlice("cap-add"), Worker: cmd.String("worker")}
			if req.MemoryBytes, err = size.Parse(cmd.String("memory")); err != nil {
				return fmt.Errorf("activate --memory: %v: %w", err, errdefs.ErrInvalidArgument)
			}
			if req.DiskBytes, err = size.Parse(cmd.String("disk")); err != nil {
				return fmt.Errorf("activate --disk: %v: %w", err, errdefs.ErrInvalidArgument)
			}
			if req.Pids < 0 || req.CPUs < 0 {
				return fmt.Errorf("activate: negative --pids or --cpus: %w", errdefs.ErrInvalidArgument)
			}
			if req.Env, err = envFlag(cmd, "activate"); err != nil {
				return err
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			v, err := a.client.Activate(ctx, req, opt)
			if err != nil {
				return err
			}
			return a.printAttempt(raw, v)
		}),
	}
}

func (a *app) suspendCommand() *cli.Command {
	return &cli.Command{
		Name:      "suspend",
		Usage:     "seal an attempt's changes into a node, then release it",
		ArgsUsage: "ATTEMPT [--logical-state JSON] [--keep-running]",
		Description: "A draft node becomes sealed with the attempt's tree; a sealed node gets a new\n" +
			"sealed child. Stop writing to the root first. --keep-running seals a checkpoint\n" +
			"and leaves the attempt active: its next seal becomes a child of this one.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "logical-state", Usage: "the sealed node's logical state (JSON; default the node's)"},
			&cli.BoolFlag{Name: "keep-running", Usage: "seal a checkpoint and keep the attempt active"},
			&cli.Uint64Flag{Name: "token", Usage: "the lease's fencing token, checked if given"},
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			state, err := jsonFlag(cmd, "logical-state")
			if err != nil {
				return err
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			bar := a.spinner("sealing")
			res, err := a.client.Suspend(ctx, v1.SuspendRequest{AttemptID: cmd.Args().First(), LogicalState: state,
				KeepRunning: cmd.Bool("keep-running"), Token: cmd.Uint64("token")}, opt)
			bar.Finish()
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			a.table([][2]string{
				{"node_id", res.Node.NodeID},
				{"status", string(res.Node.Status)},
				{"root_id", res.Node.RootID},
				{"attempt_id", res.Attempt.AttemptID},
				{"attempt_state", string(res.Attempt.State)},
			})
			return nil
		}),
	}
}

func (a *app) releaseCommand() *cli.Command {
	return &cli.Command{
		Name:      "release",
		Usage:     "end an attempt: unmount its root and drop its unsealed changes",
		ArgsUsage: "ATTEMPT",
		Flags: []cli.Flag{
			&cli.Uint64Flag{Name: "token", Usage: "the lease's fencing token, checked if given"},
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			v, err := a.client.Release(ctx, v1.ReleaseRequest{AttemptID: cmd.Args().First(), Token: cmd.Uint64("token")}, opt)
			if err != nil {
				return err
			}
			return a.printAttempt(raw, v)
		}),
	}
}

func (a *app) retryCommand() *cli.Command {
	return &cli.Command{
		Name:      "retry",
		Usage:     "start a new attempt on the node of a failed one",
		ArgsUsage: "ATTEMPT [--ttl D]",
		Flags: []cli.Flag{
			ttlFlag(fmt.Sprintf("lease time to live (default %v)", v1.DefaultLeaseTTL)),
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			ttl, err := ttlMillis(cmd)
			if err != nil {
				return err
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			v, err := a.client.Retry(ctx, v1.RetryRequest{AttemptID: cmd.Args().First(), TTLMillis: ttl}, opt)
			if err != nil {
				return err
			}
			return a.printAttempt(raw, v)
		}),
	}
}

func (a *app) leaseCommand() *cli.Command {
	return &cli.Command{
		Name:  "lease",
		Usage: "manage attempt leases",
		Commands: []*cli.Command{{
			Name:      "renew",
			Usage:     "extend a live lease by its TTL (or --ttl) from now",
			ArgsUsage: "LEASE --token T [--ttl D]",
			Flags: []cli.Flag{
				&cli.Uint64Flag{Name: "token", Usage: "the lease's current fencing token", Required: true},
				ttlFlag("new time to live (default: the lease's)"),
				idempotencyKeyFlag(),
			},
			Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
				if err := exactArgs(cmd, 1); err != nil {
					return err
				}
				ttl, err := ttlMillis(cmd)
				if err != nil {
					return err
				}
				var raw []byte
				opt := a.callOptions(cmd)
				opt.Raw = &raw
				l, err := a.client.Renew(ctx, v1.RenewRequest{LeaseID: cmd.Args().First(), Token: cmd.Uint64("token"), TTLMillis: ttl}, opt)
				if err != nil {
					return err
				}
				if a.json {
					return a.printRaw(raw)
				}
				fmt.Fprintf(a.stdout, "lease %s token %d expires %s\n", l.LeaseID, l.Token, l.ExpiresAt.Format("2006-01-02 15:04:05.000 MST"))
				return nil
			}),
		}},
	}
}

func (a *app) mountCommand() *cli.Command {
	return &cli.Command{
		Name:      "mount",
		Usage:     "show a node at DIR, read-only, or writable as a new attempt with --rw",
		ArgsUsage: "NODE DIR [--rw]",
		Description: "DIR must be an existing empty directory on the daemon's host (a relative DIR\n" +
			"is resolved here). Without --rw it shows the node's tree read-only; with --rw it\n" +
			"activates an attempt whose writable root is DIR (suspend or umount it later).\n" +
			"esfctl umount DIR undoes either.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "rw", Usage: "mount a writable attempt root"},
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 2); err != nil {
				return err
			}
			dir, err := filepath.Abs(cmd.Args().Get(1))
			if err != nil {
				return fmt.Errorf("mount %s: %v: %w", cmd.Args().Get(1), err, errdefs.ErrInvalidArgument)
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			res, err := a.client.Mount(ctx, v1.MountRequest{NodeID: cmd.Args().First(), Dir: dir, RW: cmd.Bool("rw")}, opt)
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			if res.Attempt != nil {
				fmt.Fprintf(a.stdout, "attempt %s: writable root at %s (lease %s)\n", res.Attempt.AttemptID, res.Dir, res.Attempt.LeaseID)
				return nil
			}
			fmt.Fprintf(a.stdout, "root %s read-only at %s\n", res.RootID, res.Dir)
			return nil
		}),
	}
}

func (a *app) umountCommand() *cli.Command {
	return &cli.Command{
		Name:      "umount",
		Usage:     "undo a mount: remove a read-only view, or release the attempt rooted at DIR",
		ArgsUsage: "DIR",
		Flags:     []cli.Flag{idempotencyKeyFlag()},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			dir, err := filepath.Abs(cmd.Args().First())
			if err != nil {
				return fmt.Errorf("umount %s: %v: %w", cmd.Args().First(), err, errdefs.ErrInvalidArgument)
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			res, err := a.client.Umount(ctx, v1.UmountRequest{Dir: dir}, opt)
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			if res.Attempt != nil {
				fmt.Fprintf(a.stdout, "unmounted %s: attempt %s %s\n", res.Dir, res.Attempt.AttemptID, res.Attempt.State)
				return nil
			}
			fmt.Fprintf(a.stdout, "unmounted %s\n", res.Dir)
			return nil
		}),
	}
}
