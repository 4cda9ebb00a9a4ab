package daytona_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/daytona"
	"github.com/esf-dev/esf/adapters/workspace/daytona/daytonafake"
	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

func create(t *testing.T, p *daytona.Provider, spec workspace.Spec) workspace.Session {
	t.Helper()
	s, err := p.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil && !errors.Is(err, workspace.ErrNotFound) {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func providerError(t *testing.T, err error) *workspace.ProviderError {
	t.Helper()
	var pe *workspace.ProviderError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v carries no *workspace.ProviderError", err)
	}
	return pe
}

// eventually polls cond for up to two seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after 2s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunOutputIsByteExact: the daemon logs output line by line and ends an
// unterminated last line with "\n"; the adapter's end marks recover the
// exact bytes on both streams. NUL bytes are the documented loss.
func TestRunOutputIsByteExact(t *testing.T) {
	_, p := newFake(t, daytonafake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	long := strings.Repeat("x", 200<<10)
	for _, tc := range []struct {
		name, cmd, out, err string
	}{
		{"no newline", "printf abc", "abc", ""},
		{"blank lines", `printf 'a\n\n\n'`, "a\n\n\n", ""},
		{"empty", "true", "", ""},
		{"only newline", "echo", "\n", ""},
		{"mark-like byte at end", `printf 'x\036'`, "x\x1e", ""},
		{"mark-like line", `printf '\036\n'`, "\x1e\n", ""},
		{"label-like bytes", `printf 'a\001\001b\002'`, "a\x01\x01b\x02", ""},
		{"stderr unterminated", "printf out; printf err >&2", "out", "err"},
		{"interleaved", "echo 1; echo 2 >&2; printf 3; printf 4 >&2", "1\n3", "2\n4"},
		{"long line without newline", "printf %s " + long, long, ""},
		{"carriage returns and tabs", `printf 'a\r\n\tb'`, "a\r\n\tb", ""},
		{"NUL bytes are dropped like the daemon does", `printf 'a\000b\n'`, "ab\n", ""},
	} {
		res, err := s.Run(context.Background(), sandbox.Spec{}, tc.cmd)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if string(res.Stdout) != tc.out || string(res.Stderr) != tc.err {
			t.Errorf("%s: Run(%.40q) = stdout %.60q, stderr %.60q; want %.60q, %.60q", tc.name, tc.cmd, res.Stdout, res.Stderr, tc.out, tc.err)
		}
	}
}

// TestRunStdinIsByteExact: Stdin travels inside the command as a printf
// format; every byte value must arrive.
func TestRunStdinIsByteExact(t *testing.T) {
	_, p := newFake(t, daytonafake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	var in bytes.Buffer
	for range 4 {
		for c := range 256 {
			in.WriteByte(byte(c))
		}
	}
	in.WriteString("%s %% \\ ' \" $HOME `x`\n")
	res, err := s.Run(context.Background(), sandbox.Spec{Stdin: bytes.NewReader(in.Bytes())}, "cat > stdin.bin")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Run: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
	}
	got, err := s.Read(context.Background(), "stdin.bin")
	if err != nil || !bytes.Equal(got, in.Bytes()) {
		t.Fatalf("stdin arrived as %d bytes (%v), want the %d sent", len(got), err, in.Len())
	}
}

// TestRunStdinOverLimitIsUnsupported: Daytona cannot stream stdin, so stdin
// is bounded; beyond the bound nothing is started.
func TestRunStdinOverLimitIsUnsupported(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{}, func(c *daytona.Config) { c.MaxStdin = 1024 })
	s := create(t, p, workspace.Spec{})
	_, err := s.Run(context.Background(), sandbox.Spec{Stdin: bytes.NewReader(make([]byte, 1025))}, "cat")
	if !errors.Is(err, workspace.ErrUnsupported) {
		t.Fatalf("Run with 1025 bytes of stdin over a 1024 limit = %v, want ErrUnsupported", err)
	}
	if n := srv.ToolboxSessions(); n != 0 {
		t.Errorf("%d process sessions opened for a refused Run", n)
	}
	res, err := s.Run(context.Background(), sandbox.Spec{Stdin: bytes.NewReader(make([]byte, 1024))}, "wc -c")
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "1024" {
		t.Errorf("Run with stdin at the limit = %q, %v", res.Stdout, err)
	}
}

// TestRunSignalExitCodes: a command killed by signal N exits 128+N.
func TestRunSignalExitCodes(t *testing.T) {
	_, p := newFake(t, daytonafake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	for sig, want := range map[string]int{"KILL": 137, "TERM": 143, "INT": 130} {
		res, err := s.Run(context.Background(), sandbox.Spec{}, "kill -"+sig+" $$")
		if err != nil || res.ExitCode != want {
			t.Errorf("kill -%s $$: exit %d, %v; want %d", sig, res.ExitCode, err, want)
		}
	}
}

// TestRunLeavesNoProcess: a Run that times out, is cancelled or finishes
// leaves no process and no process session in the sandbox by the time it
// returns.
func TestRunLeavesNoProcess(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	check := func(what string) {
		t.Helper()
		if n, m := srv.Processes(), srv.ToolboxSessions(); n != 0 || m != 0 {
			t.Errorf("%s: %d processes and %d process sessions remain", what, n, m)
		}
	}
	_, err := s.Run(context.Background(), sandbox.Spec{Timeout: 200 * time.Millisecond}, "sleep 60")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run past Timeout = %v", err)
	}
	check("after a timeout")

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = s.Run(ctx, sandbox.Spec{}, "sleep 60 & sleep 60")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run past its ctx deadline = %v", err)
	}
	check("after a ctx deadline, with a background child")

	if _, err := s.Run(context.Background(), sandbox.Spec{}, "(sleep 60 >/dev/null 2>&1 &); echo done"); err != nil {
		t.Fatal(err)
	}
	check("after a command that left a background process")
}

// TestRunSeesPauseFromAnotherHandle: stopping the sandbox under a running
// command ends the Run with ErrPaused.
func TestRunSeesPauseFromAnotherHandle(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	other, err := p.Attach(context.Background(), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := s.Run(context.Background(), sandbox.Spec{Stdout: writerFunc(func(b []byte) {
			select {
			case <-started:
			default:
				close(started)
			}
		})}, "echo up; sleep 60")
		done <- err
	}()
	<-started
	if err := other.(workspace.Pauser).Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, workspace.ErrPaused) {
			t.Errorf("Run under a Pause = %v, want ErrPaused", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the sandbox was stopped")
	}
	if n := srv.Processes(); n != 0 {
		t.Errorf("%d processes survived the stop", n)
	}
	if err := other.(workspace.Pauser).Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Run(context.Background(), sandbox.Spec{}, "echo back"); err != nil || string(res.Stdout) != "back\n" {
		t.Errorf("Run after Resume through another handle = %q, %v", res.Stdout, err)
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

// TestCreateEndingMidwayLeavesNothing: whatever moment ctx ends at, no
// sandbox is live once Create returns (not merely eventually). Slow
// transitions make the sandbox still pending when the cleanup deletes it,
// which Daytona answers with 409 until it has started.
func TestCreateEndingMidwayLeavesNothing(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{Transition: 60 * time.Millisecond}, nil)
	for _, d := range []time.Duration{0, time.Microsecond, 200 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		s, err := p.Create(ctx, workspace.Spec{})
		cancel()
		if err == nil {
			s.Close(context.Background())
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Create with a %v deadline = %v, want DeadlineExceeded", d, err)
		}
		if n := srv.Live(); n != 0 {
			t.Fatalf("Create with a %v deadline returned (%v) leaving %d live sandboxes", d, err, n)
		}
	}
}

// TestCreateFailures: a sandbox that ends in error or build_failed, and a
// refused snapshot, are provider errors carrying Daytona's state or status,
// and leave nothing behind.
func TestCreateFailures(t *testing.T) {
	opts := daytonafake.Options{Snapshots: []string{"good", "broken"}, FailImages: []string{"broken", "broken:image"}}
	srv, snap := newFake(t, opts, nil)
	oci, err := daytona.New(daytona.Config{APIKey: fakeKey, APIURL: srv.URL(), ImageKind: daytona.ImageOCI, PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		p      *daytona.Provider
		image  string
		code   string
		status int
	}{
		{"snapshot fails to start", snap, "broken", "error", 0},
		{"image fails to build", oci, "broken:image", "build_failed", 0},
		{"unknown snapshot", snap, "missing", "", http.StatusBadRequest},
	} {
		_, err := tc.p.Create(context.Background(), workspace.Spec{Image: tc.image})
		if !errors.Is(err, workspace.ErrProvider) {
			t.Errorf("%s: Create = %v, want ErrProvider", tc.name, err)
			continue
		}
		pe := providerError(t, err)
		if pe.Code != tc.code || pe.Status != tc.status || pe.Provider != "daytona" || pe.Op != "create" {
			t.Errorf("%s: ProviderError %+v; want code %q, status %d", tc.name, *pe, tc.code, tc.status)
		}
		if n := srv.Live(); n != 0 {
			t.Errorf("%s: %d sandboxes left", tc.name, n)
		}
	}
}

// TestCreateRequest: what the adapter asks Daytona for - image or snapshot,
// env, metadata and configured labels, target, TTL from Spec.Timeout,
// auto-stop.
func TestCreateRequest(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{}, func(c *daytona.Config) {
		c.ImageKind = daytona.ImageOCI
		c.Target = "eu"
		c.Labels = map[string]string{"team": "a"}
		c.AutoStopMinutes = -1
	})
	s := create(t, p, workspace.Spec{Image: "debian:13", WorkDir: "work", Env: map[string]string{"A": "1"},
		Metadata: map[string]string{"k": "v"}, Timeout: 90 * time.Second})
	sb, ok := srv.Inspect(s.ID())
	if !ok {
		t.Fatal("sandbox not found in the fake")
	}
	want := daytonafake.Sandbox{Image: "debian:13", Target: "eu", TTLMinutes: 2, AutoStopInterval: 0}
	if sb.Image != want.Image || sb.Snapshot != "" || sb.Target != want.Target || sb.TTLMinutes != want.TTLMinutes || sb.AutoStopInterval != 0 {
		t.Errorf("sandbox %+v; want image %s, target eu, ttl 2, auto-stop 0", sb, want.Image)
	}
	if sb.Env["A"] != "1" || sb.Labels["k"] != "v" || sb.Labels["team"] != "a" || sb.Labels["esf.dev/workdir"] != "work" {
		t.Errorf("env %v, labels %v", sb.Env, sb.Labels)
	}
	if !strings.HasPrefix(sb.Name, "esf-") {
		t.Errorf("name %q: Create must name the sandbox to find it after a lost answer", sb.Name)
	}
	if res, err := s.Run(context.Background(), sandbox.Spec{}, "pwd"); err != nil || string(res.Stdout) != "/home/daytona/work\n" {
		t.Errorf("pwd in a session with WorkDir work = %q, %v", res.Stdout, err)
	}
	// The attached handle learns WorkDir from the label.
	other, err := p.Attach(context.Background(), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if res, err := other.Run(context.Background(), sandbox.Spec{}, "pwd"); err != nil || string(res.Stdout) != "/home/daytona/work\n" {
		t.Errorf("pwd through an attached handle = %q, %v", res.Stdout, err)
	}
	_, err = p.Create(context.Background(), workspace.Spec{Metadata: map[string]string{"esf.dev/x": "y"}})
	if !errors.Is(err, workspace.ErrUnsupported) {
		t.Errorf("Create with reserved metadata = %v, want ErrUnsupported", err)
	}
}

// TestRateLimitRetriesHonourRetryAfter: 429 is retried after Retry-After.
func TestRateLimitRetriesHonourRetryAfter(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	srv.Throttle(2, 0)
	if _, err := p.Attach(context.Background(), s.ID()); err != nil {
		t.Fatalf("Attach through two 429s: %v", err)
	}
	if n := srv.Throttled(); n != 2 {
		t.Errorf("fake refused %d requests, want 2", n)
	}
	srv.Throttle(1, time.Second)
	start := time.Now()
	if _, err := p.Sessions(context.Background()); err != nil {
		t.Fatalf("Sessions through a 429 with Retry-After 1: %v", err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("retried after %v, before Retry-After", took)
	}
}

// TestRateLimitExhaustedIsPolicy: when retries run out, or the server asks
// for a longer wait than MaxRetryWait, the error is ErrPolicy with the
// server's RetryAfter; a streamed upload is never retried.
func TestRateLimitExhaustedIsPolicy(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{}, func(c *daytona.Config) {
		c.MaxRetries = 1
		c.MaxRetryWait = 1500 * time.Millisecond
	})
	s := create(t, p, workspace.Spec{})
	if err := s.Write(context.Background(), "f", []byte("old")); err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error, retryAfter time.Duration) {
		t.Helper()
		if !errors.Is(err, workspace.ErrPolicy) || errors.Is(err, workspace.ErrProvider) {
			t.Fatalf("%s: %v, want ErrPolicy alone", what, err)
		}
		pe := providerError(t, err)
		if pe.Status != http.StatusTooManyRequests || pe.RetryAfter != retryAfter {
			t.Errorf("%s: ProviderError %+v, want status 429, RetryAfter %v", what, *pe, retryAfter)
		}
	}

	srv.Throttle(5, time.Second)
	start := time.Now()
	_, err := p.Attach(context.Background(), s.ID())
	check("retries exhausted", err, time.Second)
	if took := time.Since(start); took < time.Second || took > 3*time.Second {
		t.Errorf("one retry after Retry-After 1s took %v", took)
	}

	srv.Throttle(1, 60*time.Second)
	start = time.Now()
	_, err = p.Sessions(context.Background())
	check("Retry-After beyond MaxRetryWait", err, 60*time.Second)
	if took := time.Since(start); took > time.Second {
		t.Errorf("a refused wait still took %v", took)
	}

	srv.Throttle(1, 0, "/files/upload-v2")
	err = s.Upload(context.Background(), "f", strings.NewReader("new"))
	check("streamed upload", err, 0)
	if n := srv.Throttled(); n != 2+1+1 {
		t.Errorf("fake refused %d requests, want 4 (two for Attach, one each for Sessions and the upload, which is not retried)", n)
	}
	srv.Throttle(0, 0)
	if got, err := s.Read(context.Background(), "f"); err != nil || string(got) != "old" {
		t.Errorf("after a refused upload the file reads %q, %v", got, err)
	}
	if fi, err := s.List(context.Background(), "."); err != nil || len(fi) != 1 {
		t.Errorf("after a refused upload the home holds %v, %v; want f alone", fi, err)
	}
}

// TestAuth: API key, JWT with organisation, and their refusals.
func TestAuth(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{JWT: "jwt-token", OrganizationID: "org-1"}, nil)
	s := create(t, p, workspace.Spec{})
	if res, err := s.Run(context.Background(), sandbox.Spec{}, "echo ok"); err != nil || string(res.Stdout) != "ok\n" {
		t.Fatalf("Run with JWT auth = %q, %v", res.Stdout, err)
	}
	for _, cfg := range []daytona.Config{
		{JWTToken: "jwt-token", OrganizationID: "org-2", APIURL: srv.URL()},
		{APIKey: "wrong", APIURL: srv.URL()},
	} {
		bad, err := daytona.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = bad.Create(context.Background(), workspace.Spec{})
		if !errors.Is(err, workspace.ErrPolicy) || providerError(t, err).Status != http.StatusUnauthorized {
			t.Errorf("Create with bad credentials = %v, want ErrPolicy (401)", err)
		}
		_, err = bad.Attach(context.Background(), s.ID())
		if !errors.Is(err, workspace.ErrPolicy) {
			t.Errorf("Attach with bad credentials = %v, want ErrPolicy", err)
		}
	}
	for _, cfg := range []daytona.Config{
		{},
		{JWTToken: "x"},
		{APIKey: "x", APIURL: "ftp://example.com"},
		{APIKey: "x", Labels: map[string]string{"esf.dev/mine": "1"}},
		{APIKey: "x", ImageKind: 7},
	} {
		if _, err := daytona.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted a bad configuration", cfg)
		}
	}
}

// TestSessionsFollowsPagesAndLabels: the Enumerator reads every page and
// sees only sandboxes with the configured labels, which it does not report
// as metadata.
func TestSessionsFollowsPagesAndLabels(t *testing.T) {
	srv, a := newFake(t, daytonafake.Options{PageSize: 2}, func(c *daytona.Config) { c.Labels = map[string]string{"team": "a"} })
	b, err := daytona.New(daytona.Config{APIKey: fakeKey, APIURL: srv.URL(), Labels: map[string]string{"team": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for i := range 5 {
		s := create(t, a, workspace.Spec{WorkDir: "w", Metadata: map[string]string{"i": fmt.Sprint(i)}})
		ids[s.ID()] = true
	}
	create(t, b, workspace.Spec{})
	infos, err := a.Sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 5 {
		t.Fatalf("Sessions = %d entries, want 5", len(infos))
	}
	for _, in := range infos {
		if !ids[in.ID] || in.Paused || len(in.Metadata) != 1 || in.Metadata["i"] == "" {
			t.Errorf("Sessions entry %+v", in)
		}
	}
	if infos, err := b.Sessions(context.Background()); err != nil || len(infos) != 1 {
		t.Errorf("the other team sees %d sessions, %v; want 1", len(infos), err)
	}
}

// TestCloseWaitsOutAStateChange: Daytona refuses deletes while a state
// change is pending (409); Close waits for it and then deletes.
func TestCloseWaitsOutAStateChange(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{Transition: 150 * time.Millisecond}, nil)
	s, err := p.Create(context.Background(), workspace.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := p.Attach(context.Background(), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { other.(workspace.Pauser).Pause(context.Background()) })
	eventually(t, "stop requested", func() bool {
		sb, _ := srv.Inspect(s.ID())
		return sb.DesiredState == "stopped"
	})
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close during a stop: %v", err)
	}
	if n := srv.Live(); n != 0 {
		t.Errorf("%d sandboxes live after Close", n)
	}
	wg.Wait()
}

// TestAttachWaitsForAStartingSandbox: a sandbox still being created is
// waited for; attaching never starts or stops anything.
func TestAttachWaitsForAStartingSandbox(t *testing.T) {
	srv, p := newFake(t, daytonafake.Options{Transition: 100 * time.Millisecond}, nil)
	req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/sandbox", strings.NewReader(`{"name":"raw"}`))
	req.Header.Set("Authorization", "Bearer "+fakeKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sb struct{ ID, State string }
	json.NewDecoder(resp.Body).Decode(&sb)
	resp.Body.Close()
	if sb.State != "creating" {
		t.Fatalf("fake answered create in state %q", sb.State)
	}
	s, err := p.Attach(context.Background(), "raw") // by name
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	if s.ID() != sb.ID {
		t.Errorf("Attach by name gave id %q, want %q", s.ID(), sb.ID)
	}
	if res, err := s.Run(context.Background(), sandbox.Spec{}, "echo ready"); err != nil || string(res.Stdout) != "ready\n" {
		t.Errorf("Run on the attached sandbox = %q, %v", res.Stdout, err)
	}
}

// TestDownloadStreams: a download is read while it arrives, and the fake
// and adapter agree on large sizes.
func TestDownloadStreams(t *testing.T) {
	_, p := newFake(t, daytonafake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	if res, err := s.Run(context.Background(), sandbox.Spec{}, "head -c 5000000 /dev/zero > z"); err != nil || res.ExitCode != 0 {
		t.Fatal(res, err)
	}
	rc, err := s.Download(context.Background(), "~/z")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, rc)
	rc.Close()
	if err != nil || n != 5000000 {
		t.Errorf("Download = %d bytes, %v", n, err)
	}
	_, err = s.Download(context.Background(), "/etc/passwd")
	if !errors.Is(err, fs.ErrPermission) {
		t.Errorf("Download outside the fake's sandbox directories = %v, want fs.ErrPermission", err)
	}
}
