package e2b_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b"
	"github.com/esf-dev/esf/adapters/workspace/e2b/e2bfake"
	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

// waitFor polls cond for up to five seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i == 500 {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRateLimitRetry: idempotent calls wait out 429 as Retry-After says,
// within MaxRetries; exhausted retries and waits longer than MaxRetryWait
// are ErrPolicy with the provider's RetryAfter; create is never retried.
func TestRateLimitRetry(t *testing.T) {
	srv, p := newFake(t, e2bfake.Options{}, func(c *e2b.Config) { c.MaxRetries = 2; c.MaxRetryWait = 2 * time.Second })
	s := create(t, p, workspace.Spec{})
	ctx := ctxT(t)
	const get = "GET /sandboxes/{id}"

	cases := []struct {
		name       string
		limit      int
		retryAfter time.Duration
		wantErr    bool
		wantCalls  int
		minTook    time.Duration
	}{
		{"one 429 then success", 1, time.Second, false, 2, time.Second},
		{"two 429 then success", 2, 0, false, 3, 0}, // no Retry-After: backoff
		{"exhausted", 5, time.Second, true, 3, 2 * time.Second},
		{"wait beyond MaxRetryWait", 5, 30 * time.Second, true, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := srv.Calls(get) + srv.Calls("POST /sandboxes/{id}/connect")
			srv.RateLimit(tc.limit, tc.retryAfter)
			defer srv.RateLimit(0, 0)
			start := time.Now()
			_, err := p.Attach(ctx, s.ID())
			took := time.Since(start)
			calls := srv.Calls(get) + srv.Calls("POST /sandboxes/{id}/connect") - before
			if tc.wantErr {
				var pe *workspace.ProviderError
				if !errors.Is(err, workspace.ErrPolicy) || !errors.As(err, &pe) || pe.Status != 429 || pe.RetryAfter != tc.retryAfter {
					t.Fatalf("Attach = %v (%#v), want ErrPolicy with status 429 and RetryAfter %v", err, pe, tc.retryAfter)
				}
			} else if err != nil {
				t.Fatalf("Attach: %v", err)
			}
			if tc.wantErr && calls != tc.wantCalls || !tc.wantErr && calls != tc.wantCalls+1 { // +1: the connect after the GET
				t.Errorf("%d control-plane calls, want %d (+1 connect on success)", calls, tc.wantCalls)
			}
			if took < tc.minTook {
				t.Errorf("took %v, want at least %v (Retry-After honoured)", took, tc.minTook)
			}
		})
	}

	t.Run("create not retried", func(t *testing.T) {
		before := srv.Calls("POST /sandboxes")
		srv.RateLimit(1, time.Second)
		_, err := p.Create(ctx, workspace.Spec{})
		if !errors.Is(err, workspace.ErrPolicy) {
			t.Fatalf("Create = %v, want ErrPolicy", err)
		}
		if n := srv.Calls("POST /sandboxes") - before; n != 1 {
			t.Errorf("create sent %d times", n)
		}
		if srv.Count() != 1 {
			t.Errorf("%d sandboxes, want the one from before", srv.Count())
		}
	})
}

// TestConcurrencyLimitIsPolicy: the team limit's 429 has no Retry-After.
func TestConcurrencyLimitIsPolicy(t *testing.T) {
	_, p := newFake(t, e2bfake.Options{MaxSandboxes: 1}, nil)
	create(t, p, workspace.Spec{})
	_, err := p.Create(ctxT(t), workspace.Spec{})
	var pe *workspace.ProviderError
	if !errors.Is(err, workspace.ErrPolicy) || !errors.As(err, &pe) || !strings.Contains(pe.Message, "maximum number of concurrent") {
		t.Fatalf("Create over the limit = %v", err)
	}
}

// TestAuthFailureIsPolicy: a wrong API key is ErrPolicy, never NotFound.
func TestAuthFailureIsPolicy(t *testing.T) {
	_, p := newFake(t, e2bfake.Options{}, func(c *e2b.Config) { c.APIKey = "e2b_wrong" })
	_, err := p.Create(ctxT(t), workspace.Spec{})
	if !errors.Is(err, workspace.ErrPolicy) {
		t.Fatalf("Create with a wrong key = %v, want ErrPolicy", err)
	}
	_, err = p.Attach(ctxT(t), "ianything")
	if !errors.Is(err, workspace.ErrPolicy) {
		t.Fatalf("Attach with a wrong key = %v, want ErrPolicy", err)
	}
}

// TestPauseWhilePausing: with a slow pause, a second handle's Pause meets
// 409 ("cannot be paused while in 'pausing' state") and waits it out; a
// Resume meets 409 ("is being paused") and waits too.
func TestPauseWhilePausing(t *testing.T) {
	srv, p := newFake(t, e2bfake.Options{PauseDelay: 300 * time.Millisecond, ResumeDelay: 100 * time.Millisecond}, nil)
	s := create(t, p, workspace.Spec{})
	other, err := p.Attach(ctxT(t), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Add(2)
	go func() { defer wg.Done(); errs[0] = s.(workspace.Pauser).Pause(ctx) }()
	go func() {
		defer wg.Done()
		time.Sleep(50 * time.Millisecond)
		errs[1] = other.(workspace.Pauser).Pause(ctx)
	}()
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("concurrent Pause = %v, %v", errs[0], errs[1])
	}
	if n := srv.Calls("POST /sandboxes/{id}/pause"); n < 2 {
		t.Errorf("%d pause calls, want the second handle's 409 too", n)
	}
	// Resume races a new pause from the other handle.
	if err := s.(workspace.Pauser).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); errs[2] = other.(workspace.Pauser).Pause(ctx) }()
	time.Sleep(50 * time.Millisecond)
	err = s.(workspace.Pauser).Resume(ctx)
	wg.Wait()
	if err != nil || errs[2] != nil {
		t.Fatalf("Resume during a pause = %v; Pause = %v", err, errs[2])
	}
	if _, err := s.Run(ctx, sandbox.Spec{}, "true"); err != nil {
		t.Errorf("Run after Resume: %v", err)
	}
}

// TestCreateSlowServerLeavesNothing: the service takes a while to create;
// Creates whose context ends meanwhile still kill what they caused.
func TestCreateSlowServerLeavesNothing(t *testing.T) {
	srv, p := newFake(t, e2bfake.Options{CreateDelay: 300 * time.Millisecond}, nil)
	for _, d := range []time.Duration{time.Millisecond, 50 * time.Millisecond, 250 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		_, err := p.Create(ctx, workspace.Spec{})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Create with %v = %v, want DeadlineExceeded", d, err)
		}
		if n := srv.Count(); n != 0 {
			t.Errorf("after a Create cut at %v, %d sandboxes live", d, n)
		}
	}
}

// TestCreateLostAnswerCleansByToken: when the create request itself is
// cut (CleanupTimeout shorter than the service), the sandbox is found by
// its metadata token and killed, and the list's filter is checked on the
// client, not trusted.
func TestCreateLostAnswerCleansByToken(t *testing.T) {
	srv, p := newFake(t, e2bfake.Options{CreateDelay: 500 * time.Millisecond}, func(c *e2b.Config) {
		c.CleanupTimeout = 100 * time.Millisecond
	})
	keep := create(t, p, workspace.Spec{Metadata: map[string]string{"keep": "1"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	_, err := p.Create(ctx, workspace.Spec{})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Create = %v", err)
	}
	if n := srv.Count(); n != 1 {
		t.Errorf("%d sandboxes live, want only the kept one", n)
	}
	if _, err := p.Attach(ctxT(t), keep.ID()); err != nil {
		t.Errorf("the unrelated sandbox was harmed: %v", err)
	}
}

// TestRunCancelKillsProcess: envd keeps a process whose stream went away,
// so the adapter must kill it; the fake counts processes.
func TestRunCancelKillsProcess(t *testing.T) {
	e2bfake.RequireJail(t)
	srv, p := newFake(t, e2bfake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	for _, tc := range []struct {
		name string
		spec sandbox.Spec
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancel", sandbox.Spec{}, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		{"ctx deadline", sandbox.Spec{}, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, context.DeadlineExceeded},
		{"spec timeout", sandbox.Spec{Timeout: 300 * time.Millisecond}, func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			_, err := s.Run(ctx, tc.spec, "sleep 60 & sleep 60; echo done")
			if !errors.Is(err, tc.want) {
				t.Fatalf("Run = %v, want %v", err, tc.want)
			}
			waitFor(t, "the fake's processes to end", func() bool { return srv.Processes() == 0 })
		})
	}
}

// TestRunExitAndSignals: exit codes, signals as 128+N, stdin, and the
// keepalive events a quiet command gets are ignored.
func TestRunExitAndSignals(t *testing.T) {
	e2bfake.RequireJail(t)
	_, p := newFake(t, e2bfake.Options{Keepalive: 50 * time.Millisecond}, func(c *e2b.Config) { c.Keepalive = -1 })
	s := create(t, p, workspace.Spec{})
	ctx := ctxT(t)
	for _, tc := range []struct {
		cmd  string
		in   string
		code int
		out  string
	}{
		{"exit 3", "", 3, ""},
		{"kill -9 $$", "", 137, ""},
		{"kill -TERM $$", "", 143, ""},
		{"sleep 0.3; echo quiet", "", 0, "quiet\n"},
		{"tr a-z A-Z", "hello\n", 0, "HELLO\n"},
	} {
		spec := sandbox.Spec{}
		if tc.in != "" {
			spec.Stdin = strings.NewReader(tc.in)
		}
		res, err := s.Run(ctx, spec, tc.cmd)
		if err != nil || res.ExitCode != tc.code || string(res.Stdout) != tc.out {
			t.Errorf("Run(%q) = %d %q, %v; want %d %q", tc.cmd, res.ExitCode, res.Stdout, err, tc.code, tc.out)
		}
	}
}

// TestStdinNeedsEnvd052: CloseStdin arrived in envd 0.5.2; older sandboxes
// cannot deliver EOF, so Stdin is ErrUnsupported before anything runs.
func TestStdinNeedsEnvd052(t *testing.T) {
	_, p := newFake(t, e2bfake.Options{EnvdVersion: "0.5.1"}, nil)
	s := create(t, p, workspace.Spec{})
	_, err := s.Run(ctxT(t), sandbox.Spec{Stdin: strings.NewReader("x")}, "cat")
	if !errors.Is(err, workspace.ErrUnsupported) {
		t.Fatalf("Run with Stdin on envd 0.5.1 = %v, want ErrUnsupported", err)
	}
}

// TestReclaimedSandbox: a sandbox the service removed (timeout) answers
// ErrNotFound through every handle, via the proxy's 502 and a GET.
func TestReclaimedSandbox(t *testing.T) {
	srv, p := newFake(t, e2bfake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	ctx := ctxT(t)
	if err := s.Write(ctx, "f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	srv.Kill(s.ID())
	_, err := s.Read(ctx, "f")
	if !errors.Is(err, workspace.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read = %v, want ErrNotFound only", err)
	}
	if _, err := s.Run(ctx, sandbox.Spec{}, "true"); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("Run = %v, want ErrNotFound", err)
	}
	if err := s.Close(ctx); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("Close = %v, want ErrNotFound", err)
	}
}

// TestExpiry: Spec.Timeout is the sandbox's lifetime on the service;
// Refresh extends it, SetTimeout sets it.
func TestExpiry(t *testing.T) {
	srv, p := newFake(t, e2bfake.Options{}, nil)
	s := create(t, p, workspace.Spec{Timeout: time.Second})
	if err := s.(*e2b.Session).Refresh(ctxT(t), 3*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if srv.Count() != 1 {
		t.Fatal("the sandbox expired despite Refresh")
	}
	if err := s.(*e2b.Session).Refresh(ctxT(t), 2*time.Hour); !errors.Is(err, workspace.ErrProvider) {
		t.Errorf("Refresh beyond an hour = %v, want the service's 400", err)
	}
	if err := s.(*e2b.Session).SetTimeout(ctxT(t), time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sandbox to expire", func() bool { return srv.Count() == 0 })
	if _, err := p.Attach(ctxT(t), s.ID()); !errors.Is(err, workspace.ErrNotFound) {
		t.Errorf("Attach after expiry = %v", err)
	}
}

// TestHostRouting: without SandboxURL, envd is reached at
// <port>-<id>.<domain>; ProxyAddr dials the fake while the Host header
// names the sandbox, and the traffic token travels in its header.
func TestHostRouting(t *testing.T) {
	e2bfake.RequireJail(t)
	var hosts sync.Map
	srv, err := e2bfake.New(e2bfake.Options{APIKey: testKey, TrafficToken: true, Domain: "sbx.test", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cfg := e2b.Config{APIKey: testKey, APIURL: srv.URL, Domain: "sbx.test", EnvdScheme: "http", ProxyAddr: srv.Addr(),
		HTTPClient: &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
			hosts.Store(r.Host, true)
			r.Header.Del("E2b-Sandbox-Id") // prove the Host alone routes
			return http.DefaultTransport.RoundTrip(r)
		})}}
	p, err := e2b.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := create(t, p, workspace.Spec{})
	res, err := s.Run(ctxT(t), sandbox.Spec{}, "echo routed")
	if err != nil || string(res.Stdout) != "routed\n" {
		t.Fatalf("Run = %q, %v", res.Stdout, err)
	}
	if _, ok := hosts.Load("49983-" + s.ID() + ".sbx.test"); !ok {
		var seen []string
		hosts.Range(func(k, _ any) bool { seen = append(seen, k.(string)); return true })
		t.Errorf("no request with the sandbox's virtual host; saw %q", seen)
	}
	// Without the traffic token the proxy refuses: ErrPolicy.
	cfg.TrafficTokenHeaders = []string{"x-wrong-header"}
	p2, _ := e2b.New(cfg)
	s2, err := p2.Attach(ctxT(t), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Run(ctxT(t), sandbox.Spec{}, "true"); !errors.Is(err, workspace.ErrPolicy) {
		t.Errorf("Run without the traffic token = %v, want ErrPolicy", err)
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestSessionsHidesAdapterMetadata: the adapter's own metadata keys stay
// out of Info, the caller's come back.
func TestSessionsHidesAdapterMetadata(t *testing.T) {
	_, p := newFake(t, e2bfake.Options{}, nil)
	s := create(t, p, workspace.Spec{WorkDir: "w", Metadata: map[string]string{"owner": "me"}})
	infos, err := p.Sessions(ctxT(t))
	if err != nil || len(infos) != 1 {
		t.Fatalf("Sessions = %+v, %v", infos, err)
	}
	if infos[0].ID != s.ID() || len(infos[0].Metadata) != 1 || infos[0].Metadata["owner"] != "me" {
		t.Errorf("Info = %+v", infos[0])
	}
}

// TestAttachKeepsWorkDir: the working directory travels in metadata.
func TestAttachKeepsWorkDir(t *testing.T) {
	e2bfake.RequireJail(t)
	_, p := newFake(t, e2bfake.Options{}, nil)
	s := create(t, p, workspace.Spec{WorkDir: "~/proj"})
	other, err := p.Attach(ctxT(t), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	res, err := other.Run(ctxT(t), sandbox.Spec{}, "pwd")
	if err != nil || string(res.Stdout) != "/home/user/proj\n" {
		t.Errorf("pwd through an attached handle = %q, %v", res.Stdout, err)
	}
}

// TestUploadStreamsInBoundedMemory: a 256 MiB round trip through adapter
// and fake (one process) never grows the heap by anything near the file.
func TestUploadStreamsInBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 256 MiB")
	}
	_, p := newFake(t, e2bfake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	ctx := ctxT(t)
	const size = 256 << 20
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	if err := s.Upload(ctx, "big", io.LimitReader(zeros{}, size)); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Download(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, rc)
	rc.Close()
	close(stop)
	wg.Wait()
	if err != nil || n != size {
		t.Fatalf("downloaded %d bytes, %v", n, err)
	}
	if grew := int64(peak.Load()) - int64(base.HeapInuse); grew > 48<<20 {
		t.Errorf("heap grew by %d MiB while moving %d MiB", grew>>20, size>>20)
	} else {
		t.Logf("heap grew by at most %d KiB while moving %d MiB", grew>>10, size>>20)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestReadErrors: file errors are *fs.PathError with the io/fs classes.
func TestReadErrors(t *testing.T) {
	_, p := newFake(t, e2bfake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	ctx := ctxT(t)
	if err := s.Write(ctx, "d/f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"Read dir", func() error { _, err := s.Read(ctx, "d"); return err }(), fs.ErrInvalid},
		{"Read missing", func() error { _, err := s.Read(ctx, "nope"); return err }(), fs.ErrNotExist},
		{"List missing", func() error { _, err := s.List(ctx, "nope"); return err }(), fs.ErrNotExist},
		{"Delete missing", s.Delete(ctx, "nope"), fs.ErrNotExist},
		{"Write over dir", s.Write(ctx, "d", []byte("x")), fs.ErrInvalid},
		{"Upload to /", s.Upload(ctx, "/", bytes.NewReader(nil)), fs.ErrInvalid},
	} {
		var pe *fs.PathError
		if !errors.Is(tc.err, tc.want) || !errors.As(tc.err, &pe) || errors.Is(tc.err, workspace.ErrProvider) {
			t.Errorf("%s = %v, want a *fs.PathError matching %v only", tc.name, tc.err, tc.want)
		}
	}
}
