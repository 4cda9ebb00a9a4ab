package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"

	"github.com/urfave/cli/v3"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
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
			"-o json changes only how esfctl's own errors are printed.\n\n" +
			"-i copies esfctl's stdin to the command; its end closes the command's\n" +
			"stdin (on a terminal, types ^D). -t runs the command on a terminal\n" +
			"(runc only; all its output comes on stdout) of this terminal's size,\n" +
			"following its resizes; with -i too, this terminal is in raw mode until\n" +
			"the command ends, so keys like ^C and ^D go to the command.",
		UseShortOptionHandling: true, // -it
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "interactive", Aliases: []string{"i"}, Usage: "copy stdin to the command"},
			&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "run the command on a terminal"},
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
			req := v1.ExecRequest{AttemptID: args[0], Args: args[1:], Workdir: cmd.String("workdir"),
				User: cmd.String("user"), Module: cmd.String("module"), TTY: cmd.Bool("tty")}
			if len(req.Args) == 0 && req.Module == "" {
				return fmt.Errorf("exec: no command after the attempt: %w", errdefs.ErrInvalidArgument)
			}
			if len(req.Args) == 0 {
				req.Args = nil
			}
			env, err := envFlag(cmd, "exec")
			if err != nil {
				return err
			}
			req.Env = env
			if d := cmd.Duration("timeout"); d < 0 {
				return fmt.Errorf("exec --timeout %s: negative: %w", d, errdefs.ErrInvalidArgument)
			} else if d > 0 {
				req.TimeoutMillis = max(d.Milliseconds(), 1)
			}
			s := client.ExecStreams{Stdout: a.stdout, Stderr: a.stderr}
			if cmd.Bool("interactive") {
				s.Stdin = a.stdin
			}
			if req.TTY {
				t := a.openTerminal(s.Stdin != nil)
				defer t.close()
				req.Rows, req.Cols = t.rows, t.cols
				s.Resize = t.sizes
			}
			res, err := a.client.ExecIO(ctx, req, s)
			if err != nil {
				return err
			}
			a.exitCode = res.ExitCode
			if res.OOMKilled {
				fmt.Fprintln(os.Stderr, "esfctl: exec: killed by the OOM killer (the attempt's memory limit)")
			}
			return nil
		}),
	}
}

// envFlag reads the repeatable --env K=V flag.
func envFlag(cmd *cli.Command, verb string) ([]string, error) {
	var env []string
	for _, kv := range cmd.StringSlice("env") {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("%s --env %q: want K=V: %w", verb, kv, errdefs.ErrInvalidArgument)
		}
		env = append(env, kv)
	}
	return env, nil
}

// terminal is esfctl's side of exec -t: the local terminal's size and
// resizes, and its modes while the command runs. Without a local terminal
// the command still gets one, of the kernel's default size.
type terminal struct {
	rows, cols uint16
	sizes      chan [2]uint16 // nil without a local terminal
	restore    []func()       // undone in reverse
	stop       chan struct{}
	wg         sync.WaitGroup
}

// openTerminal finds the local terminal (stdin, else stdout) and reads its
// size and follows SIGWINCH. With raw (exec -it) stdin's terminal goes raw:
// keys such as ^C and ^D are bytes for the remote terminal. Output
// processing is off on stdout's terminal either way: the remote terminal
// already made the line endings.
func (a *app) openTerminal(raw bool) *terminal {
	t := &terminal{stop: make(chan struct{})}
	tty := func(v any) *os.File {
		if f, ok := v.(*os.File); ok && a.isTTY(f) {
			return f
		}
		return nil
	}
	stdin, stdout := tty(a.stdin), tty(a.stdout)
	if raw && stdin != nil {
		if old, err := term.MakeRaw(int(stdin.Fd())); err == nil {
			t.restore = append(t.restore, func() { term.Restore(int(stdin.Fd()), old) })
		}
	}
	if stdout != nil {
		fd := int(stdout.Fd())
		if tio, err := unix.IoctlGetTermios(fd, unix.TCGETS); err == nil && tio.Oflag&unix.OPOST != 0 {
			old := *tio
			tio.Oflag &^= unix.OPOST
			if unix.IoctlSetTermios(fd, unix.TCSETS, tio) == nil {
				t.restore = append(t.restore, func() { unix.IoctlSetTermios(fd, unix.TCSETS, &old) })
			}
		}
	}
	local := stdin
	if local == nil {
		local = stdout
	}
	if local == nil {
		return t
	}
	fd := int(local.Fd())
	size := func() ([2]uint16, bool) {
		cols, rows, err := term.GetSize(fd)
		if err != nil || rows <= 0 || cols <= 0 || rows > 0xffff || cols > 0xffff {
			return [2]uint16{}, false
		}
		return [2]uint16{uint16(rows), uint16(cols)}, true
	}
	if sz, ok := size(); ok {
		t.rows, t.cols = sz[0], sz[1]
	}
	t.sizes = make(chan [2]uint16, 1)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, unix.SIGWINCH)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer signal.Stop(winch)
		for {
			select {
			case <-t.stop:
				return
			case <-winch:
			}
			sz, ok := size()
			if !ok {
				continue
			}
			// The latest size wins over one not yet sent.
			select {
			case <-t.sizes:
			default:
			}
			t.sizes <- sz
		}
	}()
	return t
}

// close restores the terminal and stops following its size.
func (t *terminal) close() {
	close(t.stop)
	t.wg.Wait()
	for i := len(t.restore) - 1; i >= 0; i-- {
		t.restore[i]()
	}
}
