package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
)

// The graph verbs: group create, fork, inspect, tree, promote, evaluate,
// prune. Each sends one request (evaluate first uploads its evidence) and
// prints the result for humans, or the daemon's JSON with -o json.

// jsonFlag reads a flag that holds a JSON document; absent is nil.
func jsonFlag(cmd *cli.Command, name string) (json.RawMessage, error) {
	if !cmd.IsSet(name) {
		return nil, nil
	}
	s := cmd.String(name)
	if !json.Valid([]byte(s)) {
		return nil, fmt.Errorf("--%s %q: not valid JSON: %w", name, s, errdefs.ErrInvalidArgument)
	}
	return json.RawMessage(s), nil
}

// isRootID reports whether s is a root id (64 lowercase hex digits).
func isRootID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func (a *app) groupCommand() *cli.Command {
	return &cli.Command{
		Name:  "group",
		Usage: "create checkpoint groups",
		Commands: []*cli.Command{{
			Name:      "create",
			Usage:     "create a group whose sealed root node is SRC or ROOT_ID",
			ArgsUsage: "--from SRC|ROOT_ID [--name NAME] [--policy JSON] [--logical-state JSON]",
			Description: "SRC is what import takes: a directory, a tar or an OCI image, read by the\n" +
				"daemon (a relative SRC is resolved here first), or - for a tar on stdin (streamed\n" +
				"to the daemon first). A 64-hex-digit ROOT_ID names a stored root (write ./ID for\n" +
				"a file of that name). The group starts at generation 1 with the root node\n" +
				"canonical. --name gives the group a name unique in the graph, usable as an E2B\n" +
				"templateID (docs/e2b.md).",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "from", Usage: "SRC, - or ROOT_ID", Required: true},
				&cli.StringFlag{Name: "name", Usage: "a unique name for the group: letters, digits, '.', '_', '-'"},
				&cli.StringFlag{Name: "policy", Usage: "the group's policy (JSON)"},
				&cli.StringFlag{Name: "logical-state", Usage: "the root node's logical state (JSON)"},
				idempotencyKeyFlag(),
			},
			Action: a.action(a.groupCreate),
		}},
	}
}

func (a *app) groupCreate(ctx context.Context, cmd *cli.Command) error {
	if err := exactArgs(cmd, 0); err != nil {
		return err
	}
	req := v1.CreateGroupRequest{Name: cmd.String("name")}
	var err error
	if req.Policy, err = jsonFlag(cmd, "policy"); err != nil {
		return err
	}
	if req.LogicalState, err = jsonFlag(cmd, "logical-state"); err != nil {
		return err
	}
	opt := a.callOptions(cmd)
	switch from := cmd.String("from"); {
	case from == "":
		return fmt.Errorf("group create: empty --from: %w", errdefs.ErrInvalidArgument)
	case from == "-":
		// The import is content-addressed: a retry stores nothing new and
		// finds the same root, so it needs no key of its own.
		imp, err := a.importStdin(ctx, client.CallOptions{})
		if err != nil {
			return err
		}
		req.RootID, req.Source = imp.RootID.String(), "-"
	case isRootID(from):
		req.RootID = from
	default:
		abs, err := filepath.Abs(from)
		if err != nil {
			return fmt.Errorf("group create --from %s: %v: %w", from, err, errdefs.ErrInvalidArgument)
		}
		req.Source = abs
	}
	var raw []byte
	opt.Raw = &raw
	bar := a.spinner("creating group")
	res, err := a.client.CreateGroup(ctx, req, opt)
	bar.Finish()
	if err != nil {
		return err
	}
	if a.json {
		return a.printRaw(raw)
	}
	rows := [][2]string{{"group_id", res.Group.GroupID}}
	if res.Group.Name != "" {
		rows = append(rows, [2]string{"name", res.Group.Name})
	}
	a.table(append(rows, [][2]string{
		{"node_id", res.Node.NodeID + " (root, canonical)"},
		{"root_id", res.Node.RootID},
		{"generation", fmt.Sprint(res.Group.Generation)},
	}...))
	return nil
}

func (a *app) forkCommand() *cli.Command {
	return &cli.Command{
		Name:      "fork",
		Usage:     "create N draft children of a sealed node (metadata only) and print their ids",
		ArgsUsage: "NODE [-n N] [--logical-state JSON]",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "n", Usage: "number of children", Value: 1},
			&cli.StringFlag{Name: "logical-state", Usage: "the children's logical state (JSON; default the parent's)"},
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			n := cmd.Int("n")
			if n < 1 || n > v1.MaxFork {
				return fmt.Errorf("fork: -n %d: want 1..%d: %w", n, v1.MaxFork, errdefs.ErrInvalidArgument)
			}
			state, err := jsonFlag(cmd, "logical-state")
			if err != nil {
				return err
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			res, err := a.client.Fork(ctx, v1.ForkRequest{NodeID: cmd.Args().First(), N: n, LogicalState: state}, opt)
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			for _, n := range res.Nodes {
				fmt.Fprintln(a.stdout, n.NodeID)
			}
			return nil
		}),
	}
}

func (a *app) inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "show a group, node or attempt",
		ArgsUsage: "ID",
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			var raw []byte
			in, err := a.client.Inspect(ctx, cmd.Args().First(), client.CallOptions{Raw: &raw})
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			switch {
			case in.Group != nil:
				a.table(groupRows(in.Group))
			case in.Node != nil:
				a.table(nodeRows(in.Node))
			case in.Attempt != nil:
				a.table(attemptRows(in.Attempt))
			}
			return nil
		}),
	}
}

func groupRows(g *v1.GroupView) [][2]string {
	rows := [][2]string{
		{"group_id", g.GroupID},
		{"root_node_id", g.RootNodeID},
		{"canonical_node_id", g.CanonicalNodeID},
		{"generation", fmt.Sprint(g.Generation)},
		{"nodes", fmt.Sprint(g.Nodes)},
		{"created_at", g.CreatedAt.Format("2006-01-02 15:04:05.000 MST")},
	}
	if len(g.Policy) > 0 {
		rows = append(rows, [2]string{"policy", compactJSON(g.Policy)})
	}
	return rows
}

func nodeRows(n *v1.NodeView) [][2]string {
	rows := [][2]string{
		{"node_id", n.NodeID},
		{"group_id", n.GroupID},
		{"status", string(n.Status)},
		{"root_id", n.RootID},
		{"parents", list(n.Parents)},
		{"ancestry", list(n.Ancestry)},
		{"children", list(n.Children)},
		{"attempts", list(n.Attempts)},
		{"visits", fmt.Sprint(n.Visits)},
		{"value", fmt.Sprint(n.Value)},
		{"created_at", n.CreatedAt.Format("2006-01-02 15:04:05.000 MST")},
		{"provenance", provenance(n.Provenance.Op, n.Provenance.Source, n.Provenance.AttemptID)},
	}
	if len(n.LogicalState) > 0 {
		rows = append(rows, [2]string{"logical_state", compactJSON(n.LogicalState)})
	}
	for _, l := range n.Leases {
		rows = append(rows, [2]string{"lease", fmt.Sprintf("%s attempt %s token %d expires %s",
			l.LeaseID, l.AttemptID, l.Token, l.ExpiresAt.Format("15:04:05.000"))})
	}
	for _, e := range n.Evaluations {
		flags := ""
		if e.Terminal {
			flags += " terminal"
		}
		if e.Backprop {
			flags += " backprop"
		}
		rows = append(rows, [2]string{"evaluation", fmt.Sprintf("%s %s@%s reward %g verdict %q%s",
			e.EvaluationID, e.Evaluator, e.EvaluatorVersion, e.Reward, e.Verdict, flags)})
	}
	return rows
}

func attemptRows(v *v1.AttemptView) [][2]string {
	rows := [][2]string{
		{"attempt_id", v.AttemptID},
		{"node_id", v.NodeID},
		{"group_id", v.GroupID},
		{"state", string(v.State)},
		{"executor", v.Executor},
	}
	if v.Root != "" {
		rows = append(rows, [2]string{"root", v.Root})
	}
	if v.Lease != nil {
		rows = append(rows,
			[2]string{"lease_id", v.Lease.LeaseID},
			[2]string{"token", fmt.Sprint(v.Lease.Token)},
			[2]string{"expires_at", v.Lease.ExpiresAt.Format("2006-01-02 15:04:05.000 MST")})
	}
	if v.ResultNodeID != "" {
		rows = append(rows, [2]string{"result_node_id", v.ResultNodeID})
	}
	if v.RetryOf != "" {
		rows = append(rows, [2]string{"retry_of", v.RetryOf})
	}
	if v.Error != "" {
		rows = append(rows, [2]string{"error", v.Error})
	}
	return rows
}

func list(ids []string) string {
	if len(ids) == 0 {
		return "-"
	}
	return strings.Join(ids, " ")
}

func provenance(op, source, attempt string) string {
	s := op
	if source != "" {
		s += " from " + source
	}
	if attempt != "" {
		s += " by " + attempt
	}
	return s
}

func compactJSON(b json.RawMessage) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

func (a *app) treeCommand() *cli.Command {
	return &cli.Command{
		Name:      "tree",
		Usage:     "show a group's graph: short ids, status, reward or visits/value, canonical marked *",
		ArgsUsage: "GROUP [--dot]",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "dot", Usage: "print Graphviz dot instead"},
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			var raw []byte
			tv, err := a.client.Tree(ctx, cmd.Args().First(), client.CallOptions{Raw: &raw})
			if err != nil {
				return err
			}
			switch {
			case a.json:
				return a.printRaw(raw)
			case cmd.Bool("dot"):
				return renderDot(a.stdout, tv)
			}
			return renderTree(a.stdout, tv)
		}),
	}
}

func (a *app) promoteCommand() *cli.Command {
	return &cli.Command{
		Name:      "promote",
		Usage:     "make NODE the group's canonical node if the group is still at generation G",
		ArgsUsage: "GROUP NODE --expected-generation G",
		Flags: []cli.Flag{
			&cli.Uint64Flag{Name: "expected-generation", Usage: "the generation the group must be at", Required: true},
			idempotencyKeyFlag(),
		},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 2); err != nil {
				return err
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			g, err := a.client.Promote(ctx, v1.PromoteRequest{GroupID: cmd.Args().Get(0), NodeID: cmd.Args().Get(1),
				ExpectedGeneration: cmd.Uint64("expected-generation")}, opt)
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			fmt.Fprintf(a.stdout, "group %s: canonical %s, generation %d\n", g.GroupID, g.CanonicalNodeID, g.Generation)
			return nil
		}),
	}
}

func (a *app) evaluateCommand() *cli.Command {
	return &cli.Command{
		Name:      "evaluate",
		Usage:     "record an evaluation of a sealed node or of an attempt's result",
		ArgsUsage: "NODE|ATTEMPT --evaluator NAME@VERSION --reward R --verdict V [--evidence FILE]... [--terminal] [--backprop]",
		Description: "Each --evidence file is uploaded to the daemon's store first (content-addressed:\n" +
			"the same file is stored once) and referenced by its id. --terminal makes the node\n" +
			"terminal; --backprop adds one visit and R to the value of the node and of every\n" +
			"ancestor, once per idempotency key.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "evaluator", Usage: "NAME@VERSION of the evaluator", Required: true},
			&cli.FloatFlag{Name: "reward", Usage: "the reward", Required: true},
			&cli.StringFlag{Name: "verdict", Usage: "the verdict", Required: true},
			&cli.StringSliceFlag{Name: "evidence", Usage: "a file to store as evidence (repeatable)"},
			&cli.BoolFlag{Name: "terminal", Usage: "the node becomes terminal"},
			&cli.BoolFlag{Name: "backprop", Usage: "add a visit and the reward to the node and its ancestors"},
			idempotencyKeyFlag(),
		},
		// --evidence a,b.log names one file, not two. (Per command: the
		// root's setting does not reach its subcommands' flags.)
		DisableSliceFlagSeparator: true,
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			req := v1.EvaluateRequest{Target: cmd.Args().First(), Evaluator: cmd.String("evaluator"),
				Reward: cmd.Float("reward"), Verdict: cmd.String("verdict"),
				Terminal: cmd.Bool("terminal"), Backprop: cmd.Bool("backprop")}
			opt := a.callOptions(cmd)
			for _, p := range cmd.StringSlice("evidence") {
				id, err := a.uploadEvidence(ctx, p)
				if err != nil {
					return err
				}
				req.Evidence = append(req.Evidence, id)
			}
			var raw []byte
			opt.Raw = &raw
			e, err := a.client.Evaluate(ctx, req, opt)
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			fmt.Fprintf(a.stdout, "%s: node %s reward %g verdict %q", e.EvaluationID, e.NodeID, e.Reward, e.Verdict)
			if e.Terminal {
				fmt.Fprint(a.stdout, " terminal")
			}
			if e.Backprop {
				fmt.Fprint(a.stdout, " backprop")
			}
			fmt.Fprintf(a.stdout, " (%d evidence)\n", len(e.Evidence))
			return nil
		}),
	}
}

func (a *app) uploadEvidence(ctx context.Context, p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("evidence %s: %w", p, localError(err))
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("evidence %s: not a regular file: %w", p, errdefs.ErrInvalidArgument)
	}
	res, err := a.client.PutEvidence(ctx, &fileReader{f: f}, client.CallOptions{})
	if err != nil {
		return "", fmt.Errorf("evidence %s: %w", p, err)
	}
	return res.ID.String(), nil
}

// fileReader names read errors as esfctl's, not the daemon's.
type fileReader struct{ f *os.File }

func (r *fileReader) Read(p []byte) (int, error) {
	n, err := r.f.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		return n, &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: fmt.Sprintf("read %s: %v", r.f.Name(), err)}
	}
	return n, err
}

func (a *app) pruneCommand() *cli.Command {
	return &cli.Command{
		Name:      "prune",
		Usage:     "mark an unleased subtree pruned and print the nodes it pruned",
		ArgsUsage: "NODE",
		Flags:     []cli.Flag{idempotencyKeyFlag()},
		Action: a.action(func(ctx context.Context, cmd *cli.Command) error {
			if err := exactArgs(cmd, 1); err != nil {
				return err
			}
			var raw []byte
			opt := a.callOptions(cmd)
			opt.Raw = &raw
			res, err := a.client.Prune(ctx, v1.PruneRequest{NodeID: cmd.Args().First()}, opt)
			if err != nil {
				return err
			}
			if a.json {
				return a.printRaw(raw)
			}
			for _, id := range res.Pruned {
				fmt.Fprintln(a.stdout, id)
			}
			return nil
		}),
	}
}
