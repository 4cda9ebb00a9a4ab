package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/atomicfile"
)

func (a *app) gcCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "delete stored objects no node, attempt or record reaches",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Usage: "count what would be deleted, delete nothing"},
			&cli.BoolFlag{Name: "remote", Usage: "collect the remote content store (esfd --cas-remote) instead: unreachable objects, packs below half live, orphaned packs"},
			&cli.DurationFlag{Name: "remote-grace", Usage: "with --remote: keep keys younger than this (other workers' uploads in flight)", Value: time.Hour},
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 0); err != nil {
				return err
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			bar := a.spinner("collecting")
			req := v1.CollectRequest{DryRun: cmd.Bool("dry-run"), Remote: cmd.Bool("remote")}
			if req.Remote {
				req.RemoteGraceSeconds = max(int64(cmd.Duration("remote-grace").Seconds()), 1)
			}
			rep, err := a.client.Collect(ctx, req, opt)
			bar.Finish()
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			deleted := "deleted"
			if rep.DryRun {
				deleted = "would delete"
			}
			rows := [][2]string{
				{"examined", fmt.Sprint(rep.Examined)},
				{"live", fmt.Sprint(rep.Live)},
				{deleted, fmt.Sprint(rep.Deleted)},
				{"bytes reclaimed", humanBytes(rep.BytesReclaimed)},
			}
			if r := rep.Remote; r != nil {
				rows = append(rows, [2]string{"packs rewritten", fmt.Sprint(r.PacksRewritten)},
					[2]string{"packs deleted", fmt.Sprint(r.PacksDeleted)},
					[2]string{"orphaned packs", fmt.Sprint(r.Orphans)},
					[2]string{"kept (younger than grace)", fmt.Sprint(r.KeptYoung)})
			}
			a.table(rows)
			return nil
		}),
	}
}

func (a *app) mergeCommand() *cli.Command {
	return &cli.Command{
		Name:      "merge",
		Usage:     "three-way merge sealed nodes into a new node",
		ArgsUsage: "NODE NODE...",
		Description: "Merges the nodes' trees against their lowest common ancestor (or --base).\n" +
			"On a conflict nothing is created, every conflicting path is printed on\n" +
			"stderr, one per line, and the exit status is 4.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "base", Usage: "the merge base node (default: the lowest common ancestor)"},
			&cli.StringFlag{Name: "logical-state", Usage: "the merged node's logical state (JSON)"},
			&cli.BoolFlag{Name: "promote", Usage: "make the merged node canonical (needs --expected-generation)"},
			&cli.Uint64Flag{Name: "expected-generation", Usage: "the generation the group must be at, with --promote"},
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if cmd.Args().Len() < 2 {
				return fmt.Errorf("merge: want at least two nodes, got %d: %w", cmd.Args().Len(), errdefs.ErrInvalidArgument)
			}
			ls, err := jsonFlag(cmd, "logical-state")
			if err != nil {
				return err
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			res, err := a.client.Merge(ctx, v1.MergeRequest{
				Nodes: cmd.Args().Slice(), Base: cmd.String("base"), LogicalState: ls,
				Promote: cmd.Bool("promote"), ExpectedGeneration: cmd.Uint64("expected-generation"),
			}, opt)
			if err != nil {
				var pe *client.PathsError
				if errors.As(err, &pe) && !a.json {
					for _, p := range pe.Paths {
						fmt.Fprintln(a.stderr, displayPath(p))
					}
				}
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			fmt.Fprintln(a.stdout, res.Node.NodeID)
			msg := fmt.Sprintf("merged into %s (root %s, base %s)", res.Node.NodeID, res.Node.RootID, res.Base)
			if res.Group != nil {
				msg += fmt.Sprintf("; canonical, generation %d", res.Group.Generation)
			}
			fmt.Fprintln(a.stderr, msg)
			return nil
		}),
	}
}

// displayPath shows the root directory, whose path is "", as "/".
func displayPath(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

// changeLetter is the one-letter kind of a change in `esfctl diff`.
func changeLetter(kind string) string {
	switch kind {
	case v1.ChangeAdded:
		return "A"
	case v1.ChangeDeleted:
		return "D"
	case v1.ChangeModified:
		return "M"
	case v1.ChangeTypeChanged:
		return "T"
	case v1.ChangeMetaChanged:
		return "m"
	}
	return "?"
}

func (a *app) diffCommand() *cli.Command {
	return &cli.Command{
		Name:      "diff",
		Usage:     "list the paths that differ between two trees",
		ArgsUsage: "A B",
		Description: "A and B are node or root ids. Prints one line per change from A to B:\n" +
			"A added, D deleted, M modified, T type changed, m metadata only.",
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 2); err != nil {
				return err
			}
			var raw []byte
			res, err := a.client.Diff(ctx, cmd.Args().Get(0), cmd.Args().Get(1), client.CallOptions{Raw: &raw})
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			for _, c := range res.Changes {
				fmt.Fprintf(a.stdout, "%s %s\n", changeLetter(c.Kind), displayPath(c.Path))
			}
			return nil
		}),
	}
}

func (a *app) verifyProvenanceCommand() *cli.Command {
	return &cli.Command{
		Name:      "verify-provenance",
		Usage:     "check a provenance record written by an export",
		ArgsUsage: "FILE",
		Description: "Exits 0 if the record is authentic and every id it names is intact;\n" +
			"otherwise prints the problems and exits 9 (corrupt).",
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			p := cmd.Args().First()
			b, err := os.ReadFile(p)
			if err != nil {
				return fmt.Errorf("verify-provenance %s: %w", p, localError(err))
			}
			var raw []byte
			rep, err := a.client.VerifyProvenance(ctx, b, client.CallOptions{Raw: &raw})
			if err != nil {
				return err
			}
			if a.json {
				if err := a.printRaw(raw); err != nil {
					return err
				}
			} else if rep.Valid {
				fmt.Fprintf(a.stdout, "%s: valid (%d ids checked)\n", p, rep.Checked)
			} else {
				for _, pr := range rep.Problems {
					fmt.Fprintf(a.stdout, "%s: %s\n", pr.Field, pr.Problem)
				}
			}
			if !rep.Valid {
				return fmt.Errorf("verify-provenance %s: %d problem(s): %w", p, len(rep.Problems), errdefs.ErrCorrupt)
			}
			return nil
		}),
	}
}

// writeProvenance fetches the record of an export esfctl made itself and
// writes it to path, atomically.
func (a *app) writeProvenance(ctx context.Context, id string, info v1.ExportInfo, path string) error {
	rec, err := a.client.Provenance(ctx, id, info, client.CallOptions{})
	if err != nil {
		return err
	}
	b, err := jsonIndent(rec)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, b, 0o666&^a.umask); err != nil {
		return fmt.Errorf("provenance %s: %w", path, localError(err))
	}
	return nil
}

func jsonIndent(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
