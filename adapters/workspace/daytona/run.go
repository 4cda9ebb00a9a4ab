package daytona

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/vfs"
	"github.com/esf-dev/esf/workspace"
)

// Run executes command through a toolbox process session, one session per
// call: create it, start the command asynchronously, poll its exit code and
// its log, delete the session (which kills the process group) whatever
// happened. /process/execute would be one request, but it merges stdout and
// stderr into one string and cannot be cancelled; sessions keep the streams
// apart and die with the session.
//
// The session's log is read raw (X-Daytona-Split-Output: true, no SDK
// version): the daemon stores every output line as a 3-byte stream label,
// the line and "\n". Two consequences the adapter repairs or documents:
//   - the daemon ends a last unterminated line with "\n"; the command is
//     followed by a 0x1E byte on each stream, so the true end is known and
//     the output is returned byte for byte;
//   - the daemon reads lines with the shell's `read`, which drops NUL bytes:
//     binary output loses them (redirect binary output to a file and
//     Download it).
//
// Stdin: Daytona can write to a session command's stdin but never close it,
// so Stdin is read completely (up to Config.MaxStdin) and fed to the command
// from a printf pipe; the command starts once Stdin is exhausted.
func (s *Session) Run(ctx context.Context, spec sandbox.Spec, command string) (sandbox.Result, error) {
	home, cwd, err := s.ready(ctx, "run")
	if err != nil {
		return sandbox.Result{}, err
	}
	dir := cwd
	if spec.WorkDir != "" {
		if dir, err = vfs.Resolve(home, cwd, spec.WorkDir); err != nil {
			return sandbox.Result{}, err
		}
	}
	var stdin []byte
	if spec.Stdin != nil {
		stdin, err = io.ReadAll(io.LimitReader(spec.Stdin, int64(s.p.cfg.MaxStdin)+1))
		if err != nil {
			return sandbox.Result{}, fmt.Errorf("daytona run: read stdin: %w", err)
		}
		if len(stdin) > s.p.cfg.MaxStdin {
			return sandbox.Result{}, fmt.Errorf("daytona run: stdin over %d bytes cannot be fed to a Daytona command (upload it and redirect instead): %w", s.p.cfg.MaxStdin, workspace.ErrUnsupported)
		}
	}
	script, err := buildScript(dir, spec.Env, stdin, spec.Stdin != nil, command)
	if err != nil {
		return sandbox.Result{}, err
	}
	runCtx := ctx
	if spec.Timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, spec.Timeout)
		defer cancel()
	}
	res, err := s.run(runCtx, script, spec.Stdout, spec.Stderr)
	switch {
	case err == nil:
		return res, nil
	case ctx.Err() != nil:
		return res, workspace.ContextError(ctx, "daytona run", err)
	case runCtx.Err() != nil:
		return res, fmt.Errorf("daytona run: command timed out after %s (killed): %w", spec.Timeout, context.DeadlineExceeded)
	}
	return res, err
}

func (s *Session) run(ctx context.Context, script string, stdout, stderr io.Writer) (sandbox.Result, error) {
	var res sandbox.Result
	sid := "esf-run-" + randHex(8)
	if err := s.tbJSON(ctx, "run", request{method: http.MethodPost, url: "/process/session", json: map[string]string{"sessionId": sid}}, nil); err != nil {
		return res, toolboxError("run", err)
	}
	defer s.dropSession(ctx, sid)

	var started struct {
		CmdID string `json:"cmdId"`
	}
	exec := map[string]any{"command": script, "runAsync": true, "suppressInputEcho": true}
	if err := s.tbJSON(ctx, "run", request{method: http.MethodPost, url: "/process/session/" + url.PathEscape(sid) + "/exec", json: exec}, &started); err != nil {
		return res, toolboxError("run", err)
	}
	if started.CmdID == "" {
		return res, &workspace.ProviderError{Provider: providerName, Op: "run", Message: "exec answered without a command id"}
	}
	cmdURL := "/process/session/" + url.PathEscape(sid) + "/command/" + url.PathEscape(started.CmdID)

	var outBuf, errBuf bytes.Buffer
	if stdout == nil {
		stdout = &outBuf
	}
	if stderr == nil {
		stderr = &errBuf
	}
	outs := [3]*streamOut{nil, {w: stdout}, {w: stderr}}
	var dm logDemux
	emit := func(stream int, b []byte) error { return outs[stream].write(b) }
	rawLog := http.Header{"X-Daytona-Split-Output": {"true"}}
	delay := s.p.cfg.PollInterval
	for {
		var cmd struct {
			ExitCode *int `json:"exitCode"`
		}
		if err := s.tbJSON(ctx, "run", request{method: http.MethodGet, url: cmdURL}, &cmd); err != nil {
			return res, toolboxError("run", err)
		}
		log, err := s.readAll(ctx, "run", request{method: http.MethodGet, url: cmdURL + "/logs", header: rawLog})
		if err != nil {
			return res, err
		}
		final := cmd.ExitCode != nil
		progressed, err := dm.feed(log, final, emit)
		if err != nil {
			return res, fmt.Errorf("daytona run: write output: %w", err)
		}
		if final {
			for _, o := range outs[1:] {
				if err := o.finish(); err != nil {
					return res, fmt.Errorf("daytona run: write output: %w", err)
				}
			}
			res.Stdout, res.Stderr, res.ExitCode = outBuf.Bytes(), errBuf.Bytes(), *cmd.ExitCode
			return res, nil
		}
		if progressed {
			delay = s.p.cfg.PollInterval
		} else {
			delay = min(delay*2, s.p.cfg.PollMax)
		}
		if err := sleep(ctx, delay); err != nil {
			res.Stdout, res.Stderr = outBuf.Bytes(), errBuf.Bytes()
			return res, err
		}
	}
}

// dropSession deletes a process session, killing whatever still runs in it,
// on a fresh context: ctx may be why Run is ending.
func (s *Session) dropSession(ctx context.Context, sid string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.p.cfg.CleanupTimeout)
	defer cancel()
	if resp, err := s.tb(cctx, "run", request{method: http.MethodDelete, url: "/process/session/" + url.PathEscape(sid)}); err == nil {
		resp.Body.Close()
	}
}

func (s *Session) readAll(ctx context.Context, op string, rq request) ([]byte, error) {
	resp, err := s.tb(ctx, op, rq)
	if err != nil {
		return nil, toolboxError(op, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, workspace.ContextError(ctx, "daytona "+op, err)
	}
	return b, nil
}

// endMark follows the command on both streams so that the end of its
// output is known despite the daemon's line-wise logging (see Run).
const endMark = 0x1e

// buildScript is what the process session runs: cd, environment, stdin,
// then sh running command, then the end marks and the command's status.
// The session shell sources this text, so it must neither exit nor change
// shell state the next line depends on.
func buildScript(dir string, env map[string]string, stdin []byte, hasStdin bool, command string) (string, error) {
	if strings.IndexByte(command, 0) >= 0 {
		return "", fmt.Errorf("daytona run: command holds a NUL byte: %w", fs.ErrInvalid)
	}
	var b strings.Builder
	b.WriteString("cd " + shellQuote(dir) + " && ")
	if hasStdin {
		b.WriteString("printf " + printfQuote(stdin) + " | ")
	}
	if len(env) > 0 {
		b.WriteString("env")
		for _, k := range slices.Sorted(maps.Keys(env)) {
			v := env[k]
			if k == "" || strings.HasPrefix(k, "-") || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
				return "", fmt.Errorf("daytona run: environment variable %q: %w", k, fs.ErrInvalid)
			}
			b.WriteString(" " + shellQuote(k+"="+v))
		}
		b.WriteString(" ")
	}
	// The command reaches sh through a here-document on fd 9, not as an
	// argument: one argument may not exceed 128 KiB (MAX_ARG_STRLEN), a
	// command may. sh evaluates it as `sh -c` would ($0 "sh", its own $$,
	// exit ends only it) after closing fd 9.
	delim := "ESF_CMD_" + randHex(8)
	for strings.Contains(command, delim) {
		delim = "ESF_CMD_" + randHex(8)
	}
	b.WriteString(`/bin/sh -c 'eval "$(cat <&9)" 9<&-' sh`)
	if !hasStdin {
		b.WriteString(" </dev/null")
	}
	b.WriteString(" 9<<'" + delim + "'\n" + command + "\n" + delim + "\n")
	b.WriteString("_esf_rc=$?; printf '\\036'; printf '\\036' >&2; (exit $_esf_rc)\n")
	return b.String(), nil
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// printfQuote spells data as a printf format that prints it back byte for
// byte: printable ASCII as is, '%' and '\' escaped, everything else as a
// three-digit octal escape (POSIX printf), all in single quotes.
func printfQuote(data []byte) string {
	var b strings.Builder
	b.Grow(len(data) + 2)
	b.WriteByte('\'')
	for _, c := range data {
		switch {
		case c == '%':
			b.WriteString("%%")
		case c == '\\':
			b.WriteString(`\\`)
		case c == '\'' || c < 0x20 || c > 0x7e:
			fmt.Fprintf(&b, `\%03o`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// The daemon's stream labels (common-go log.STDOUT_PREFIX/STDERR_PREFIX).
var streamLabel = [3][]byte{nil, {1, 1, 1}, {2, 2, 2}}

// logDemux splits the growing labelled log of a session command into its
// streams, remembering how far it got.
type logDemux struct {
	off int // bytes of the log consumed
	cur int // stream of the bytes being read: 1 stdout, 2 stderr
}

// feed emits the part of log after what earlier calls consumed. Unless
// final, a tail that may be the start of a label is left for the next call.
func (d *logDemux) feed(log []byte, final bool, emit func(stream int, b []byte) error) (bool, error) {
	if len(log) < d.off {
		return false, errors.New("command log shrank")
	}
	b := log[d.off:]
	progressed := false
	for len(b) > 0 {
		if st := labelAt(b); st != 0 {
			d.cur, b, d.off = st, b[3:], d.off+3
			continue
		}
		n := nextLabel(b)
		if n < 0 {
			n = len(b)
			if !final {
				n -= partialLabel(b)
			}
		}
		if n == 0 {
			break
		}
		if d.cur != 0 {
			if err := emit(d.cur, b[:n]); err != nil {
				return progressed, err
			}
			progressed = true
		}
		b, d.off = b[n:], d.off+n
	}
	return progressed, nil
}

func labelAt(b []byte) int {
	for st := 1; st <= 2; st++ {
		if bytes.HasPrefix(b, streamLabel[st]) {
			return st
		}
	}
	return 0
}

func nextLabel(b []byte) int {
	i, j := bytes.Index(b, streamLabel[1]), bytes.Index(b, streamLabel[2])
	if i < 0 || (j >= 0 && j < i) {
		return j
	}
	return i
}

// partialLabel is the length of a suffix of b that could begin a label.
func partialLabel(b []byte) int {
	n := len(b)
	for _, c := range []byte{1, 2} {
		if n >= 2 && b[n-1] == c && b[n-2] == c {
			return 2
		}
		if n >= 1 && b[n-1] == c {
			return 1
		}
	}
	return 0
}

// streamOut forwards one stream, holding back a tail that may be the end
// mark (with the newline the daemon adds) until more output or the end.
type streamOut struct {
	w    io.Writer
	hold []byte
}

func (o *streamOut) write(b []byte) error {
	data := append(o.hold, b...)
	if len(data) == 0 {
		return nil
	}
	k := 0
	switch {
	case bytes.HasSuffix(data, []byte{endMark, '\n'}):
		k = 2
	case data[len(data)-1] == endMark:
		k = 1
	}
	o.hold = append([]byte(nil), data[len(data)-k:]...)
	if len(data) == k {
		return nil
	}
	_, err := o.w.Write(data[:len(data)-k])
	return err
}

// finish drops the end mark and writes what is left.
func (o *streamOut) finish() error {
	rest := o.hold
	switch {
	case bytes.HasSuffix(rest, []byte{endMark, '\n'}):
		rest = rest[:len(rest)-2]
	case bytes.HasSuffix(rest, []byte{endMark}):
		rest = rest[:len(rest)-1]
	}
	o.hold = nil
	if len(rest) == 0 {
		return nil
	}
	_, err := o.w.Write(rest)
	return err
}
