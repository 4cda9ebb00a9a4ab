package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/esf-dev/esf/api/internal/wire"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
)

// POST /v1/exec: see api/v1 for its two forms and the frames.

// checkExec is what every exec request must hold, whichever form.
func checkExec(req *fabric.ExecRequest) error {
	if len(req.Args) == 0 && req.Module == "" {
		return fmt.Errorf("exec: no command: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

func decodeExec(r *http.Request) (fabric.ExecRequest, error) {
	return decodeAs(r, execRequest, checkExec)
}

// exec runs a command and streams its output; an exec-stream request body
// is the interactive form.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	return serveExec(w, r, s.f.Exec)
}

func serveExec(w http.ResponseWriter, r *http.Request, run execFunc) error {
	if wire.MediaType(r.Header.Get("Content-Type")) == v1.MediaExecStream {
		return serveInteractive(w, r, run)
	}
	return servePlain(w, r, run)
}

// execFunc runs a command: fabric.Fabric.Exec, or a fake in tests.
type execFunc func(context.Context, fabric.ExecRequest, fabric.ExecStreams) (fabric.ExecResult, error)

// servePlain serves the plain form. The request's context is the command's:
// a client that goes away kills it.
func servePlain(w http.ResponseWriter, r *http.Request, run execFunc) error {
	req, err := decodeExec(r)
	if err != nil {
		return err
	}
	if req.Stdin || req.TTY {
		// Both need a two-way stream, which this response alone is not.
		return fmt.Errorf("exec: stdin and tty need the interactive form (Content-Type %s): %w", v1.MediaExecStream, errdefs.ErrUnsupported)
	}
	rc := http.NewResponseController(w)
	ls := &lazyStream{w: w, start: startExecStream}
	fw := wire.NewWriter(ls, rc.Flush)
	res, err := run(r.Context(), req, fabric.ExecStreams{Stdout: fw.Stream(v1.FrameStdout), Stderr: fw.Stream(v1.FrameStderr)})
	if err != nil && !ls.started {
		return err
	}
	return writeExit(fw, res, err)
}

func startExecStream(h http.Header) {
	h.Set("Content-Type", v1.MediaExecStream)
	h.Set("X-Content-Type-Options", "nosniff")
}

// writeExit ends a stream with the exit frame of res or err, and returns
// what the request log should say: err, or the failure to write the frame
// (the client left).
func writeExit(fw *wire.Writer, res fabric.ExecResult, err error) error {
	var payload []byte
	if err != nil {
		payload, _ = json.Marshal(errdefs.Wire(err))
	} else {
		payload, _ = json.Marshal(execResult(res))
	}
	if ferr := fw.Frame(v1.FrameExit, payload); ferr != nil && err == nil {
		err = ferr
	}
	return err
}
