package e2b

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/e2b/envdwire"
)

// TestProcesses: output and exit codes, a background command that
// outlives its client and is found again by List and Connect, stdin kept
// open, SendSignal, a terminal with Update, and the command timeout.
func TestProcesses(t *testing.T) {
	h := newHarness(t)
	c := h.envd(h.create(t, nil))
	ctx := context.Background()

	t.Run("output and exit code", func(t *testing.T) {
		_, ch := c.stream(ctx, t, envdwire.ProcStart, run("echo out; echo err >&2; exit 3"), nil)
		r := collect(t, ch)
		if r.pid == 0 || r.stdout != "out\n" || r.stderr != "err\n" || r.end == nil || r.end.ExitCode != 3 || !r.end.Exited {
			t.Fatalf("%+v end %+v", r, r.end)
		}
	})
	t.Run("env, cwd and user", func(t *testing.T) {
		req := run("echo $A $HOME; pwd")
		cwd := "/tmp"
		req.Process.Envs, req.Process.Cwd = map[string]string{"A": "x"}, &cwd
		rc := *c
		rc.user = "root"
		_, ch := rc.stream(ctx, t, envdwire.ProcStart, req, nil)
		if r := collect(t, ch); r.stdout != "x /root\n/tmp\n" {
			t.Fatalf("%+v", r)
		}
		// Without a cwd, root starts in its home, made at creation (the
		// busybox image has no /root).
		_, ch = rc.stream(ctx, t, envdwire.ProcStart, run("pwd; ls -ld . | cut -c1-10"), nil)
		if r := collect(t, ch); r.stdout != "/root\ndrwx------\n" {
			t.Fatalf("root without a cwd: %+v", r)
		}
		rc.user = "nobody"
		if st, _ := rc.stream(ctx, t, envdwire.ProcStart, req, nil); st != 401 {
			t.Fatalf("unknown user: %d", st)
		}
	})
	t.Run("background, list, connect, signal", func(t *testing.T) {
		sctx, cancel := context.WithCancel(ctx)
		tag := "bg"
		req := run("echo started; sleep 1000")
		req.Tag = &tag
		_, ch := c.stream(sctx, t, envdwire.ProcStart, req, nil)
		pid := waitStart(t, ch)
		if e := <-ch; e.ev == nil || e.ev.Data == nil || string(e.ev.Data.Stdout) != "started\n" {
			t.Fatalf("first output: %+v", e)
		}
		cancel() // the client leaves; the command goes on
		for range ch {
		}
		var list envdwire.ListResponse
		if st, msg := c.unary(t, envdwire.ProcList, struct{}{}, &list); st != 200 || len(list.Processes) != 1 ||
			list.Processes[0].Pid != pid || *list.Processes[0].Tag != "bg" || list.Processes[0].Config.Cmd != "/bin/sh" {
			t.Fatalf("list: %d %s %+v", st, msg, list)
		}
		_, ch = c.stream(ctx, t, envdwire.ProcConnect, &envdwire.ConnectRequest{Process: &envdwire.ProcessSelector{Tag: &tag}}, nil)
		if got := waitStart(t, ch); got != pid {
			t.Fatalf("connect: pid %d, want %d", got, pid)
		}
		if st, msg := c.unary(t, envdwire.ProcSendSignal, &envdwire.SendSignalRequest{Process: &envdwire.ProcessSelector{Pid: pid},
			Signal: envdwire.SignalKill}, nil); st != 200 {
			t.Fatalf("signal: %d %s", st, msg)
		}
		r := collect(t, ch)
		if r.end == nil || r.end.ExitCode != -1 || r.end.Exited || r.end.Status != "signal: killed" {
			t.Fatalf("killed: %+v", r.end)
		}
		if st, _ := c.unary(t, envdwire.ProcSendSignal, &envdwire.SendSignalRequest{Process: &envdwire.ProcessSelector{Pid: pid},
			Signal: envdwire.SignalKill}, nil); st != 404 {
			t.Fatalf("signal to an ended process: %d", st)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		req := run("cat; echo done")
		yes := true
		req.Stdin = &yes
		_, ch := c.stream(ctx, t, envdwire.ProcStart, req, nil)
		pid := waitStart(t, ch)
		sel := &envdwire.ProcessSelector{Pid: pid}
		for _, s := range []string{"hello ", "world\n"} {
			if st, msg := c.unary(t, envdwire.ProcSendInput, &envdwire.SendInputRequest{Process: sel, Input: &envdwire.ProcessInput{Stdin: []byte(s)}}, nil); st != 200 {
				t.Fatalf("send input: %d %s", st, msg)
			}
		}
		if st, msg := c.unary(t, envdwire.ProcCloseStdin, &envdwire.CloseStdinRequest{Process: sel}, nil); st != 200 {
			t.Fatalf("close stdin: %d %s", st, msg)
		}
		if r := collect(t, ch); r.stdout != "hello world\ndone\n" || r.end.ExitCode != 0 {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("pty", func(t *testing.T) {
		req := run("")
		req.Process.Args = nil
		req.Pty = &envdwire.PTY{Size: &envdwire.PTYSize{Cols: 80, Rows: 24}}
		_, ch := c.stream(ctx, t, envdwire.ProcStart, req, nil)
		pid := waitStart(t, ch)
		sel := &envdwire.ProcessSelector{Pid: pid}
		if st, msg := c.unary(t, envdwire.ProcUpdate, &envdwire.UpdateRequest{Process: sel, Pty: &envdwire.PTY{Size: &envdwire.PTYSize{Cols: 100, Rows: 30}}}, nil); st != 200 {
			t.Fatalf("update: %d %s", st, msg)
		}
		if st, msg := c.unary(t, envdwire.ProcSendInput, &envdwire.SendInputRequest{Process: sel,
			Input: &envdwire.ProcessInput{Pty: []byte("stty size; exit 7\n")}}, nil); st != 200 {
			t.Fatalf("send input: %d %s", st, msg)
		}
		r := collect(t, ch)
		if !strings.Contains(r.pty, "30 100") || r.end == nil || r.end.ExitCode != 7 || r.stdout != "" {
			t.Fatalf("pty: %q %+v", r.pty, r.end)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		// The timeout runs from the request, start included: one a
		// loaded machine can spend before the command runs ends the
		// call as a start failure instead. 5 s is far from that and
		// from sleep's 1000.
		_, ch := c.stream(ctx, t, envdwire.ProcStart, run("sleep 1000"), map[string]string{envdwire.HeaderTimeoutMs: "5000"})
		r := collect(t, ch)
		if r.end == nil || r.end.ExitCode != -1 || r.end.Error == nil {
			t.Fatalf("timeout: %+v", r.end)
		}
	})
	t.Run("keepalive", func(t *testing.T) {
		// A silent command (cat waiting for stdin) gets keepalives at the
		// interval the client asks for; then it ends.
		req := run("cat")
		yes := true
		req.Stdin = &yes
		_, ch := c.stream(ctx, t, envdwire.ProcStart, req, map[string]string{envdwire.HeaderKeepalive: "1"})
		pid := waitStart(t, ch)
		select {
		case e := <-ch:
			if e.ev == nil || e.ev.Keepalive == nil {
				t.Fatalf("want a keepalive, got %+v", e)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("no keepalive in 2 minutes")
		}
		c.unary(t, envdwire.ProcCloseStdin, &envdwire.CloseStdinRequest{Process: &envdwire.ProcessSelector{Pid: pid}}, nil)
		if r := collect(t, ch); r.end == nil || r.end.ExitCode != 0 {
			t.Fatalf("%+v", r)
		}
	})
}
