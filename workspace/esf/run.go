package esf

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// Run runs command with "sh -c" in the session's container (esf exec).
// spec.Env is added to the session's environment, spec.WorkDir resolves
// like a path (it must be an existing directory), and spec.Timeout is the
// daemon's: it kills the command and its descendants and Run returns an
// error matching context.DeadlineExceeded. Cancelling ctx kills them too.
// Output streams to spec.Stdout and spec.Stderr as the command writes it
// (both are written from one goroutine). A signal's exit code is 128+N.
// spec.Stdin is copied to the command's stdin (client.Client.ExecIO, the
// two-way form of esf exec) and its EOF closes it; a daemon without that
// form answers unsupported before starting anything (ErrUnsupported). As
// ExecIO documents, a Stdin whose Read blocks past the command's end is
// abandoned, not waited for.
func (s *Session) Run(ctx context.Context, spec sandbox.Spec, command string) (sandbox.Result, error) {
	if err := checkEnv("run", spec.Env); err != nil {
		return sandbox.Result{}, err
	}
	wd := s.rec.WorkDir
	if spec.WorkDir != "" {
		var err error
		if wd, err = vfs.Resolve(s.rec.Home, s.rec.WorkDir, spec.WorkDir); err != nil {
			return sandbox.Result{}, err
		}
	}
	o, err := s.begin(ctx, "run")
	if err != nil {
		return sandbox.Result{}, err
	}
	defer o.end()
	// A missing working directory would fail inside runc with a message
	// only; say it as a path error.
	if err := s.checkDir(o, wd); err != nil {
		return sandbox.Result{}, o.fail(err)
	}
	env := make([]string, 0, len(spec.Env))
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		env = append(env, k+"="+spec.Env[k])
	}
	req := v1.ExecRequest{AttemptID: o.att.id, Args: []string{"sh", "-c", command}, Env: env, Workdir: wd}
	if spec.Timeout > 0 {
		req.TimeoutMillis = max(spec.Timeout.Milliseconds(), 1)
	}
	var outBuf, errBuf bytes.Buffer
	var stdout, stderr io.Writer = &outBuf, &errBuf
	if spec.Stdout != nil {
		stdout = spec.Stdout
	}
	if spec.Stderr != nil {
		stderr = spec.Stderr
	}
	stop := o.keepAlive()
	res, err := s.p.c.ExecIO(o.ctx, req, client.ExecStreams{Stdin: spec.Stdin, Stdout: stdout, Stderr: stderr})
	stop()
	if err != nil {
		return sandbox.Result{}, o.fail(mapErr(o.ctx, "run", err, false))
	}
	if spec.Timeout > 0 && res.Millis >= req.TimeoutMillis {
		// The daemon can report a command its timeout killed as one that
		// exited: when the kill hits a child first, sh may exit on its own
		// before its turn comes (executor/runc killTree reports a timeout
		// only when it killed the main process). A command that ran its
		// whole timeout did not finish in time either way.
		return sandbox.Result{}, &workspace.ProviderError{Provider: ProviderName, Op: "run", Code: string(errdefs.CodeDeadlineExceeded),
			Message: fmt.Sprintf("command ran %dms, its timeout is %dms (exit %d)", res.Millis, req.TimeoutMillis, res.ExitCode),
			Class:   context.DeadlineExceeded}
	}
	return sandbox.Result{Stdout: outBuf.Bytes(), Stderr: errBuf.Bytes(), ExitCode: res.ExitCode}, nil
}

// checkDir reports a path error unless dir is a directory in the root.
func (s *Session) checkDir(o *op, dir string) error {
	r, err := openRoot(o.att.root)
	if err != nil {
		return err
	}
	defer r.Close()
	fd, err := r.OpenFD(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fsError("run", dir, err)
	}
	closeFD(fd)
	return nil
}
