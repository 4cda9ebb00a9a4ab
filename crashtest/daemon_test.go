package crashtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/esf-dev/esf/journal/failpoint"
)

// logBuffer collects a daemon's stderr.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// daemon is one esfd child process.
type daemon struct {
	state, socket string
	failpoints    string
	cmd           *exec.Cmd
	logs          *logBuffer
	exited        chan struct{}
	waitErr       error // valid once exited is closed
	hc            *http.Client
}

// startDaemon runs esfd on state (with the journal flags journalArgs),
// armed with the failpoint spec (none if empty), and waits until it
// answers GET /v1/status. A daemon that exits first is an error carrying
// its log.
func startDaemon(state, socket, failpoints string, journalArgs []string) (*daemon, error) {
	d := &daemon{state: state, socket: socket, failpoints: failpoints, logs: &logBuffer{}, exited: make(chan struct{})}
	args := append([]string{"--state", state, "--socket", socket, "--log-level", "debug", "--shutdown-grace", "10s"}, journalArgs...)
	d.cmd = exec.Command(esfdBin, args...)
	d.cmd.Env = childEnv(failpoints)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	d.hc = &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var nd net.Dialer
				return nd.DialContext(ctx, "unix", socket)
			},
			// A fresh connection per request: a reply lost with a killed
			// daemon must never be retried on a pooled connection.
			DisableKeepAlives:  true,
			DisableCompression: true,
		},
		Timeout: 2 * time.Minute,
	}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		d.waitErr = d.cmd.Wait()
		close(d.exited)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r, err := d.call(http.MethodGet, "/v1/status", "", nil); err == nil && r.status == http.StatusOK {
			return d, nil
		}
		select {
		case <-d.exited:
			return nil, fmt.Errorf("esfd exited during startup (%v):\n%s", d.waitErr, tail(d.logs.String()))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.kill()
			return nil, fmt.Errorf("esfd not ready after 30s:\n%s", tail(d.logs.String()))
		}
	}
}

// childEnv is our environment without anything that would steer esfd
// other than its flags, plus the failpoint spec.
func childEnv(failpoints string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ESF_") {
			continue
		}
		env = append(env, kv)
	}
	if failpoints != "" {
		env = append(env, failpoint.EnvVar+"="+failpoints)
	}
	return env
}

// reply is an HTTP response read whole.
type reply struct {
	status int
	body   []byte
}

// errorCode is the {"code"} of an error reply, "" for a success.
func (r *reply) errorCode() string {
	if r.status < 300 {
		return ""
	}
	var e struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Code
}

func (r *reply) String() string {
	return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body))
}

// call sends one request; an error means no reply arrived (the connection
// failed or died).
func (d *daemon) call(method, path, key string, body any) (*reply, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://esfd"+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := d.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &reply{status: resp.StatusCode, body: b}, nil
}

// must calls and decodes a 2xx reply into out (if not nil).
func (d *daemon) must(t testing.TB, method, path, key string, body, out any) *reply {
	t.Helper()
	r, err := d.call(method, path, key, body)
	if err != nil {
		t.Fatalf("%s %s: no reply: %v\nesfd log:\n%s", method, path, err, tail(d.logs.String()))
	}
	if r.status/100 != 2 {
		t.Fatalf("%s %s: %s\nesfd log:\n%s", method, path, r, tail(d.logs.String()))
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			t.Fatalf("%s %s: decode %T: %v\n%s", method, path, out, err, r.body)
		}
	}
	return r
}

// waitKilled waits for the daemon to exit and reports whether SIGKILL
// ended it.
func (d *daemon) waitKilled(timeout time.Duration) (bool, error) {
	select {
	case <-d.exited:
	case <-time.After(timeout):
		return false, fmt.Errorf("esfd still running %v after the reply was lost", timeout)
	}
	var ee *exec.ExitError
	if !errors.As(d.waitErr, &ee) {
		return false, fmt.Errorf("esfd exited with %v, want SIGKILL", d.waitErr)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return false, fmt.Errorf("esfd exited with %v, want SIGKILL", d.waitErr)
	}
	return true, nil
}

// alive reports whether the process still runs.
func (d *daemon) alive() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// stop shuts esfd down gracefully (SIGTERM), killing it if it hangs.
func (d *daemon) stop() error {
	if !d.alive() {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		if d.waitErr != nil {
			return fmt.Errorf("esfd exited with %v after SIGTERM:\n%s", d.waitErr, tail(d.logs.String()))
		}
		return nil
	case <-time.After(30 * time.Second):
		d.kill()
		return fmt.Errorf("esfd ignored SIGTERM for 30s")
	}
}

// kill ends the process at once and reaps it.
func (d *daemon) kill() {
	if d.alive() {
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	d.hc.CloseIdleConnections()
}

// tail keeps the end of a long log.
func tail(s string) string {
	const max = 8000
	if len(s) > max {
		return "…" + s[len(s)-max:]
	}
	return s
}
