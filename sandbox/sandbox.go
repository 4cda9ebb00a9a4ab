package sandbox

import (
	"context"
	"io"
	"time"
)

// Spec shapes one Run. The zero Spec runs the command in the sandbox's
// working directory with its environment, no stdin and no timeout beyond ctx.
type Spec struct {
	// Env is added to the sandbox's environment for this command only.
	Env map[string]string
	// WorkDir is the directory the command starts in. Relative paths resolve
	// against the sandbox's working directory; "" means that directory.
	WorkDir string
	// Timeout bounds the command. When it fires the command is killed and
	// Run returns an error that matches context.DeadlineExceeded. Zero means
	// only ctx bounds it.
	Timeout time.Duration
	// Stdin, when not nil, is copied to the command's standard input, which
	// is closed when Stdin returns io.EOF. A sandbox that cannot feed stdin
	// returns an error matching errors.ErrUnsupported before starting anything.
	Stdin io.Reader
	// Stdout and Stderr, when not nil, receive the command's output as it is
	// produced and the matching Result field stays empty. Writes come from
	// one goroutine per stream; the writers need not be safe for concurrent
	// use with each other unless they are the same writer.
	Stdout, Stderr io.Writer
}

// Result is what a command that ran to completion left behind.
type Result struct {
	Stdout, Stderr []byte
	// ExitCode is the process exit status; 128+N when signal N killed it.
	ExitCode int
}

// Sandbox runs commands.
type Sandbox interface {
	// Run runs command with "sh -c" and waits for it. A non-zero exit is
	// reported in Result.ExitCode with a nil error. Cancelling ctx kills the
	// command and returns an error matching context.Canceled (or
	// context.DeadlineExceeded); no process is left behind.
	Run(ctx context.Context, spec Spec, command string) (Result, error)
}

// Interpreter is the optional capability of evaluating a script in-process
// without a shell (a REPL kernel, a JS isolate). Check for it with a type
// assertion.
type Interpreter interface {
	Eval(ctx context.Context, language, code string) (Result, error)
}
