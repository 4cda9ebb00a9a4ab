package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/api/client"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/randid"
)

const defaultSocket = "/var/lib/esf/esfd.sock"

// exitCodes is the one table from error codes to exit statuses; --help
// prints it. Never renumber: scripts test them.
var exitCodes = []struct {
	code    errdefs.Code
	status  int
	meaning string
}{
	{"", 0, "success"},
	{errdefs.CodeInternal, 1, "internal error"},
	{errdefs.CodeInvalidArgument, 2, "invalid argument or usage error"},
	{errdefs.CodeNotFound, 3, "not found (unknown id)"},
	{errdefs.CodeConflict, 4, "conflict"},
	{errdefs.CodeStaleGeneration, 5, "stale generation"},
	{errdefs.CodeFailedPrecondition, 6, "failed precondition"},
	{errdefs.CodeQuotaExceeded, 7, "quota exceeded"},
	{errdefs.CodeDeadlineExceeded, 8, "deadline exceeded or interrupted"},
	{errdefs.CodeCorrupt, 9, "corrupt content found"},
	{errdefs.CodeUnsupported, 10, "unsupported"},
	{errdefs.CodeUnavailable, 11, "daemon unavailable (not running, wrong --socket or --host)"},
	{errdefs.CodeUnauthenticated, 12, "not authenticated (missing or invalid --token-file)"},
}

// exitStatus is the exit status of an error's code.
func exitStatus(code errdefs.Code) int {
	for _, e := range exitCodes {
		if e.code == code {
			return e.status
		}
	}
	return 1
}

func exitCodeHelp() string {
	var sb strings.Builder
	sb.WriteString("EXIT STATUS:\n")
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	for _, e := range exitCodes {
		code := string(e.code)
		if code == "" {
			code = "-"
		}
		fmt.Fprintf(tw, "   %d\t%s\t%s\n", e.status, code, e.meaning)
	}
	tw.Flush()
	return sb.String()
}

// app is one run of esfctl; its streams are injected so tests can run it in
// process.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	umask          os.FileMode
	isTTY          func(*os.File) bool

	json   bool // -o json
	client *client.Client
	socket string
	// genKey is the idempotency key esfctl made up for this run's mutation
	// (none was given); an error whose outcome is unknown names it, so the
	// user can retry the same mutation at most once.
	genKey string
	// exitCode is the status of a run that succeeded but must not exit 0:
	// exec exits with its command's status.
	exitCode int
}

// actionError marks an error returned by a verb's action, as opposed to one
// from parsing the command line (a usage error).
type actionError struct{ err error }

func (e actionError) Error() string { return e.err.Error() }
func (e actionError) Unwrap() error { return e.err }

// action adapts a verb to urfave/cli: it marks its errors as its own.
func (a *app) action(fn func(ctx context.Context, cmd *cli.Command) error) cli.ActionFunc {
	return func(ctx context.Context, cmd *cli.Command) error {
		if err := fn(ctx, cmd); err != nil {
			return actionError{err}
		}
		return nil
	}
}

func (a *app) root() *cli.Command {
	root := &cli.Command{
		Name:  "esfctl",
		Usage: "drive esfd, the Ephemeral Sandbox Fabric daemon",
		Description: "Every verb talks to esfd over its unix socket, or with --host over its network\n" +
			"API (TLS and a bearer token). Output is for humans unless\n" +
			"-o json: then results go to stdout as JSON and errors to stderr as\n" +
			"{\"error\":{\"code\",\"message\"}}. Flags may follow arguments\n" +
			"(esfctl export ID --to DIR).\n\n" + exitCodeHelp(),
		Flags: []cli.Flag{
			&cli.StringFlag{
				Name:    "socket",
				Usage:   "unix socket of esfd",
				Value:   defaultSocket,
				Sources: cli.EnvVars("ESF_SOCKET"),
			},
			&cli.StringFlag{
				Name:    "host",
				Usage:   "esfd's network API, https://HOST:PORT (esfd --listen), instead of the socket",
				Sources: cli.EnvVars("ESF_HOST"),
			},
			&cli.StringFlag{
				Name:    "token-file",
				Usage:   "file holding the bearer token for --host",
				Sources: cli.EnvVars("ESF_TOKEN_FILE"),
			},
			&cli.StringFlag{
				Name:    "cacert",
				Usage:   "CA certificate (PEM) that verifies --host (default: the system's roots)",
				Sources: cli.EnvVars("ESF_CACERT"),
			},
			&cli.StringFlag{
				Name:    "output",
				Aliases: []string{"o"},
				Usage:   "output format: table or json",
				Value:   "table",
			},
		},
		Before: func(ctx context.Context, cmd *cli.Command) (context.Context, error) {
			switch o := cmd.String("output"); o {
			case "table":
			case "json":
				a.json = true
			default:
				return ctx, fmt.Errorf("-o %q: want table or json: %w", o, errdefs.ErrInvalidArgument)
			}
			a.socket = cmd.String("socket")
			c, err := newClient(a.socket, cmd.String("host"), cmd.String("token-file"), cmd.String("cacert"))
			if err != nil {
				return ctx, err
			}
			a.client = c
			return ctx, nil
		},
		Commands: []*cli.Command{
			a.statusCommand(),
			a.workersCommand(),
			a.importCommand(),
			a.exportCommand(),
			a.fsckCommand(),
			a.groupCommand(),
			a.forkCommand(),
			a.inspectCommand(),
			a.treeCommand(),
			a.promoteCommand(),
			a.evaluateCommand(),
			a.pruneCommand(),
			a.activateCommand(),
			a.suspendCommand(),
			a.releaseCommand(),
			a.retryCommand(),
			a.leaseCommand(),
			a.mountCommand(),
			a.umountCommand(),
			a.eventsCommand(),
			a.gcCommand(),
			a.mergeCommand(),
			a.diffCommand(),
			a.verifyProvenanceCommand(),
			a.execCommand(),
			a.uiCommand(),
		},
		Reader:          a.stdin,
		Writer:          a.stdout,
		ErrWriter:       a.stderr,
		HideHelpCommand: true,
		HideVersion:     true,
		// Errors are ours to print (as JSON with -o json) and to turn into
		// exit statuses.
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
	}
	// Without OnUsageError, urfave/cli prints "Incorrect Usage" and the
	// help text itself, which would mix prose into -o json output. Each
	// command needs its own: it is not inherited.
	var quiet func(*cli.Command)
	quiet = func(c *cli.Command) {
		c.OnUsageError = func(_ context.Context, _ *cli.Command, err error, _ bool) error { return err }
		for _, sub := range c.Commands {
			quiet(sub)
		}
	}
	quiet(root)
	return root
}

// newClient is a client of the socket, or of host over the network.
func newClient(socket, host, tokenFile, caFile string) (*client.Client, error) {
	if host == "" {
		if tokenFile != "" || caFile != "" {
			return nil, fmt.Errorf("--token-file and --cacert are for --host: %w", errdefs.ErrInvalidArgument)
		}
		return client.NewClient(socket), nil
	}
	var o client.RemoteOptions
	o.Host = host
	if tokenFile != "" {
		tok, err := client.ReadTokenFile(tokenFile)
		if err != nil {
			return nil, err
		}
		o.Token = tok
	}
	if caFile != "" {
		cfg, err := client.ClientTLS(caFile)
		if err != nil {
			return nil, err
		}
		o.TLS = cfg
	}
	return client.NewRemoteClient(o)
}

// run runs esfctl with args and returns its exit status.
func (a *app) run(ctx context.Context, args []string) int {
	a.json = wantsJSON(args)
	err := a.root().Run(ctx, args)
	if a.client != nil {
		a.client.Close()
	}
	if err == nil {
		return a.exitCode
	}
	var ae actionError
	if errors.As(err, &ae) {
		err = ae.err
	} else if errdefs.Class(errdefs.CodeOf(err)) == nil {
		// From the command line parser: unknown flag, missing value, ...
		err = &errdefs.Error{Code: errdefs.CodeInvalidArgument, Message: err.Error() + " (see esfctl --help)"}
	}
	e := errdefs.Wire(err)
	if a.genKey != "" && outcomeUnknown(e.Code) {
		e = &errdefs.Error{Code: e.Code, Message: fmt.Sprintf(
			"%s (the mutation may have been applied: retry with --idempotency-key %s to apply it at most once)", e.Message, a.genKey)}
	}
	a.printError(e)
	return exitStatus(e.Code)
}

// outcomeUnknown reports whether an error leaves the caller unsure whether
// the daemon applied the mutation (the reply, not the request, may be lost).
func outcomeUnknown(code errdefs.Code) bool {
	return code == errdefs.CodeUnavailable || code == errdefs.CodeDeadlineExceeded || code == errdefs.CodeInternal
}

func (a *app) printError(e *errdefs.Error) {
	if a.json {
		b, _ := json.Marshal(map[string]*errdefs.Error{"error": e})
		fmt.Fprintf(a.stderr, "%s\n", b)
		return
	}
	fmt.Fprintf(a.stderr, "esfctl: %s (%s)\n", e.Message, e.Code)
}

// wantsJSON looks for -o json in args before they are parsed, so that even
// a command line the parser rejects gets its error in the format asked for.
func wantsJSON(args []string) bool {
	for i, s := range args {
		if s == "--" {
			break
		}
		switch s {
		case "-o", "--o", "-output", "--output":
			if i+1 < len(args) && args[i+1] == "json" {
				return true
			}
		case "-o=json", "--o=json", "-output=json", "--output=json":
			return true
		}
	}
	return false
}

// printJSON writes v to stdout as indented JSON.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table prints aligned "key  value" lines to stdout.
func (a *app) table(rows [][2]string) {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	tw.Flush()
}

// idempotencyKeyFlag is the flag of every mutating verb.
func idempotencyKeyFlag() cli.Flag {
	return &cli.StringFlag{
		Name: "idempotency-key",
		Usage: "key that makes a retry of this mutation return the first result (default: a fresh random key, " +
			"named in the error message when the outcome is unknown)",
	}
}

// callOptions returns the per-call options of a mutating verb, generating
// an idempotency key when none was given (and saying so: the daemon keeps
// the result of a made-up key a day, not for ever). A generated key is not printed
// on success (the result is the result); it is named in the error when the
// outcome is unknown (see run), which is the only time a retry needs it.
func (a *app) callOptions(cmd *cli.Command) client.CallOptions {
	key := cmd.String("idempotency-key")
	made := key == ""
	if made {
		key = "esfctl-" + randid.Hex(16)
		a.genKey = key
	}
	return client.CallOptions{IdempotencyKey: key, KeyGenerated: made}
}

// printRaw writes a JSON response body as the daemon sent it.
func (a *app) printRaw(b []byte) error {
	// esfd may answer compactly (the tree of a large group does); people
	// read -o json too, so it is printed indented like every other record.
	var ind bytes.Buffer
	if json.Indent(&ind, b, "", "  ") == nil {
		b = ind.Bytes()
	}
	if _, err := a.stdout.Write(b); err != nil {
		return err
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		_, err := io.WriteString(a.stdout, "\n")
		return err
	}
	return nil
}

// exactArgs checks the number of positional arguments.
func exactArgs(cmd *cli.Command, n int) error {
	if got := cmd.Args().Len(); got != n {
		return fmt.Errorf("%s: want %d argument(s) (%s), got %d: %w", cmd.Name, n, cmd.ArgsUsage, got, errdefs.ErrInvalidArgument)
	}
	return nil
}

// humanBytes formats n in binary units.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
