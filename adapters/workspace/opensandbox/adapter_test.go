package opensandbox_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/opensandbox"
	"github.com/esf-dev/esf/adapters/workspace/opensandbox/osfake"
	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

func create(t *testing.T, p *opensandbox.Provider, spec workspace.Spec) workspace.Session {
	t.Helper()
	s, err := p.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func run(t *testing.T, s workspace.Session, cmd string) sandbox.Result {
	t.Helper()
	res, err := s.Run(context.Background(), sandbox.Spec{}, cmd)
	if err != nil {
		t.Fatalf("Run(%q): %v", cmd, err)
	}
	return res
}

// lineWriter closes seen once its contents hold marker.
type lineWriter struct {
	mu     sync.Mutex
	b      bytes.Buffer
	marker string
	seen   chan struct{}
	once   sync.Once
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if strings.Contains(w.b.String(), w.marker) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestRunCancelKillsRemoteCommand: execd keeps a command running when its
// client goes, so a cancelled Run must interrupt it before returning.
func TestRunCancelKillsRemoteCommand(t *testing.T) {
	srv, p := newFake(t, osfake.Options{}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{marker: "started", seen: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := s.Run(ctx, sandbox.Spec{Stdout: out}, "echo started; sleep 60; echo finished")
		done <- err
	}()
	select {
	case <-out.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("no output streamed")
	}
	if n := srv.RunningCommands(); n != 1 {
		t.Fatalf("%d commands running in the fake, want 1", n)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if n := srv.RunningCommands(); n != 0 {
		t.Errorf("Run returned with %d commands still running remotely", n)
	}
}

// TestRunTimeoutKillsRemoteCommand: Spec.Timeout and a ctx deadline both end
// the remote command, including deadlines that fire before execd has even
// said which command it started.
func TestRunTimeoutKillsRemoteCommand(t *testing.T) {
	srv, p := newFake(t, osfake.Options{}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	start := time.Now()
	_, err := s.Run(context.Background(), sandbox.Spec{Timeout: 300 * time.Millisecond}, "sleep 60")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("Run past Spec.Timeout = %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Run took %v", took)
	}
	if n := srv.RunningCommands(); n != 0 {
		t.Errorf("%d commands still running after a timed-out Run", n)
	}
	for _, d := range []time.Duration{time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		_, err := s.Run(ctx, sandbox.Spec{}, "sleep 60")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Run with a %v deadline = %v", d, err)
		}
		if n := srv.RunningCommands(); n != 0 {
			t.Errorf("after a Run with a %v deadline, %d commands still run remotely", d, n)
		}
	}
	if got := run(t, s, "echo alive").Stdout; string(got) != "alive\n" {
		t.Errorf("after timeouts, echo = %q", got)
	}
}

// TestCreateLeavesNothing cancels Create at every stage: during a slow
// POST (its answer is awaited, then deleted), during a POST whose answer
// comes too late (the sandbox is found by its nonce), while polling a slow
// provision, and at execd's first answers.
func TestCreateLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts osfake.Options
		cfg  opensandbox.Config
		ds   []time.Duration
	}{
		{"slow answer", osfake.Options{CreateLatency: time.Second}, opensandbox.Config{}, []time.Duration{50 * time.Millisecond, 300 * time.Millisecond}},
		{"answer lost", osfake.Options{CreateLatency: 10 * time.Second}, opensandbox.Config{CleanupTimeout: time.Second}, []time.Duration{50 * time.Millisecond}},
		{"slow provision", osfake.Options{ProvisionDelay: time.Second}, opensandbox.Config{}, []time.Duration{100 * time.Millisecond, 500 * time.Millisecond}},
		{"execd late", osfake.Options{ExecdStartDelay: time.Second}, opensandbox.Config{}, []time.Duration{100 * time.Millisecond, 500 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, p := newFake(t, tc.opts, tc.cfg)
			for _, d := range tc.ds {
				ctx, cancel := context.WithTimeout(context.Background(), d)
				s, err := p.Create(ctx, workspace.Spec{})
				cancel()
				if err == nil {
					s.Close(context.Background())
					t.Fatalf("Create with a %v deadline succeeded", d)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Create with a %v deadline = %v, want DeadlineExceeded", d, err)
				}
			}
			waitFor(t, 10*time.Second, "a cancelled Create left a sandbox", func() bool { return srv.Live() == 0 })
			if srv.Created() == 0 {
				t.Error("the fake never saw a create: the test proves nothing")
			}
		})
	}
}

func TestCreateFailures(t *testing.T) {
	srv, p := newFake(t, osfake.Options{FailImages: []string{"no/such:image"}}, opensandbox.Config{})
	_, err := p.Create(context.Background(), workspace.Spec{Image: "no/such:image"})
	var pe *workspace.ProviderError
	if !errors.Is(err, workspace.ErrProvider) || !errors.As(err, &pe) || pe.Code != "PROVISIONING_ERROR" {
		t.Errorf("Create of an image that fails to provision = %v", err)
	}
	_, err = p.Create(context.Background(), workspace.Spec{Metadata: map[string]string{"note": "has spaces"}})
	if !errors.Is(err, workspace.ErrProvider) || !errors.As(err, &pe) || pe.Status != 400 || pe.Code != "SANDBOX::INVALID_METADATA_LABEL" {
		t.Errorf("Create with metadata that is no Kubernetes label = %v", err)
	}
	_, err = p.Create(context.Background(), workspace.Spec{Metadata: map[string]string{"workspace.esf.dev/create": "x"}})
	if !errors.Is(err, workspace.ErrPolicy) {
		t.Errorf("Create with the adapter's reserved metadata key = %v, want ErrPolicy", err)
	}
	waitFor(t, 5*time.Second, "failed Creates left sandboxes", func() bool { return srv.Live() == 0 })

	_, bad := newFake(t, osfake.Options{}, opensandbox.Config{APIKey: "wrong"})
	_, err = bad.Create(context.Background(), workspace.Spec{})
	if !errors.Is(err, workspace.ErrPolicy) || !errors.As(err, &pe) || pe.Status != 401 || pe.Code != "INVALID_API_KEY" {
		t.Errorf("Create with a wrong key = %v", err)
	}
	noImage, err := opensandbox.New(opensandbox.Config{BaseURL: srv.URL(), APIKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noImage.Create(context.Background(), workspace.Spec{}); !errors.Is(err, workspace.ErrUnsupported) {
		t.Errorf("Create with no image anywhere = %v, want ErrUnsupported", err)
	}
}

// TestRateLimit: refused calls are retried honouring Retry-After within
// bounds; beyond them the refusal is ErrPolicy with the hint.
func TestRateLimit(t *testing.T) {
	srv, p := newFake(t, osfake.Options{}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	id := s.ID()

	t.Run("retried", func(t *testing.T) {
		srv.RateLimit("GET /v1/sandboxes/"+id, 1, time.Second)
		start := time.Now()
		if _, err := p.Attach(context.Background(), id); err != nil {
			t.Fatalf("Attach after one 429: %v", err)
		}
		if took := time.Since(start); took < time.Second {
			t.Errorf("Attach returned after %v: Retry-After (1s) not honoured", took)
		}
		srv.RateLimit("POST /sandboxes/"+id+"/proxy/44772/command", 1, time.Second)
		if res, err := s.Run(context.Background(), sandbox.Spec{}, "echo ok"); err != nil || string(res.Stdout) != "ok\n" {
			t.Errorf("Run after one 429 = %q, %v", res.Stdout, err)
		}
	})

	wantPolicy := func(t *testing.T, what string, err error, retryAfter time.Duration) {
		t.Helper()
		var pe *workspace.ProviderError
		if !errors.Is(err, workspace.ErrPolicy) || !errors.As(err, &pe) || pe.Status != 429 || pe.RetryAfter != retryAfter {
			t.Errorf("%s = %v, want ErrPolicy 429 with RetryAfter %v", what, err, retryAfter)
		}
	}
	t.Run("exhausted", func(t *testing.T) {
		_, none := newFake(t, osfake.Options{}, opensandbox.Config{BaseURL: srv.URL(), MaxRetries: -1})
		srv.RateLimit("GET /v1/sandboxes/"+id, 1, 3*time.Second)
		_, err := none.Attach(context.Background(), id)
		wantPolicy(t, "Attach with retries off", err, 3*time.Second)
	})
	t.Run("hint too long", func(t *testing.T) {
		_, short := newFake(t, osfake.Options{}, opensandbox.Config{BaseURL: srv.URL(), MaxRetryWait: 500 * time.Millisecond})
		srv.RateLimit("GET /v1/sandboxes/"+id, 1, 5*time.Second)
		start := time.Now()
		_, err := short.Attach(context.Background(), id)
		wantPolicy(t, "Attach told to wait past MaxRetryWait", err, 5*time.Second)
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("took %v: waited for a hint (5s) it should have refused", took)
		}
	})
	t.Run("past the deadline", func(t *testing.T) {
		srv.RateLimit("GET /v1/sandboxes/"+id, 1, 5*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := p.Attach(ctx, id)
		wantPolicy(t, "Attach whose deadline comes before Retry-After", err, 5*time.Second)
	})
	t.Run("stream bodies are not replayed", func(t *testing.T) {
		srv.RateLimit("POST /sandboxes/"+id+"/proxy/44772/files/upload", 1, time.Second)
		err := s.Upload(context.Background(), "up.txt", strings.NewReader("data"))
		wantPolicy(t, "Upload refused once", err, time.Second)
		if _, err := s.Read(context.Background(), "up.txt"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after a refused Upload, Read = %v, want ErrNotExist", err)
		}
	})
}

// TestPauseWaitsForAsyncStates: Pause and Resume return once the slow
// transitions are done, and other handles answer ErrPaused from the moment
// Pause is asked for.
func TestPauseWaitsForAsyncStates(t *testing.T) {
	srv, p := newFake(t, osfake.Options{PauseDelay: 400 * time.Millisecond, ResumeDelay: 400 * time.Millisecond}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	other, err := p.Attach(context.Background(), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	pz := s.(workspace.Pauser)
	errc := make(chan error, 1)
	go func() { errc <- pz.Pause(context.Background()) }()
	waitFor(t, 5*time.Second, "the fake never saw the pause", func() bool { return srv.State(s.ID()) != "Running" })
	if _, err := other.Read(context.Background(), "x"); !errors.Is(err, workspace.ErrPaused) {
		t.Errorf("Read on another handle while Pausing = %v, want ErrPaused", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st := srv.State(s.ID()); st != "Paused" {
		t.Errorf("Pause returned with the sandbox %s", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err = other.(workspace.Pauser).Resume(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Resume with a deadline shorter than the transition = %v", err)
	}
	if err := other.(workspace.Pauser).Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := srv.State(s.ID()); st != "Running" {
		t.Errorf("Resume returned with the sandbox %s", st)
	}
	if got := run(t, s, "echo back").Stdout; string(got) != "back\n" {
		t.Errorf("after Resume, echo = %q", got)
	}
}

// TestPauseFromElsewhere: a pause made by another client (here another
// Provider) is not known to this handle; execd of a frozen sandbox hangs
// and then fails, and the adapter explains that failure as ErrPaused.
func TestPauseFromElsewhere(t *testing.T) {
	srv, p := newFake(t, osfake.Options{FrozenTimeout: 300 * time.Millisecond}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	if err := s.Write(context.Background(), "f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	_, q := newFake(t, osfake.Options{}, opensandbox.Config{BaseURL: srv.URL()})
	elsewhere, err := q.Attach(context.Background(), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := elsewhere.(workspace.Pauser).Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err = s.Read(context.Background(), "f")
	if !errors.Is(err, workspace.ErrPaused) || errors.Is(err, workspace.ErrProvider) {
		t.Errorf("Read of a sandbox paused elsewhere = %v, want ErrPaused only", err)
	}
	if _, err := s.Run(context.Background(), sandbox.Spec{}, "true"); !errors.Is(err, workspace.ErrPaused) {
		t.Errorf("Run after learning of the pause = %v, want ErrPaused", err)
	}
	if err := s.(workspace.Pauser).Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read(context.Background(), "f"); err != nil || string(got) != "x" {
		t.Errorf("after Resume, Read = %q, %v", got, err)
	}
}

// TestSpecMapping: Spec fields land where the brief puts them, and
// Config.Metadata scopes what Sessions sees.
func TestSpecMapping(t *testing.T) {
	srv, p := newFake(t, osfake.Options{}, opensandbox.Config{Metadata: map[string]string{"owner": "team-a"}})
	s := create(t, p, workspace.Spec{Timeout: 10 * time.Second, Env: map[string]string{"K": "v w"},
		Metadata: map[string]string{"purpose": "test"}, WorkDir: "/work/dir"})
	if got := srv.Timeout(s.ID()); got != time.Minute {
		t.Errorf("a 10s Spec.Timeout became a %v TTL, want the API's 60s minimum", got)
	}
	if got := srv.Env(s.ID())["K"]; got != "v w" {
		t.Errorf("sandbox env K = %q", got)
	}
	if got := run(t, s, "pwd; echo $K").Stdout; string(got) != "/work/dir\nv w\n" {
		t.Errorf("pwd; echo $K = %q", got)
	}
	s2 := create(t, p, workspace.Spec{Timeout: 90*time.Second + time.Millisecond})
	if got := srv.Timeout(s2.ID()); got != 91*time.Second {
		t.Errorf("a 90.001s Spec.Timeout became %v", got)
	}
	s3 := create(t, p, workspace.Spec{})
	if got := srv.Timeout(s3.ID()); got != opensandbox.DefaultTimeout {
		t.Errorf("no Spec.Timeout became %v", got)
	}
	_, manual := newFake(t, osfake.Options{}, opensandbox.Config{BaseURL: srv.URL(), DefaultTimeout: -1})
	s4 := create(t, manual, workspace.Spec{})
	if got := srv.Timeout(s4.ID()); got != 0 {
		t.Errorf("DefaultTimeout -1 became a %v TTL, want none", got)
	}

	infos, err := p.Sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 3 {
		t.Fatalf("Sessions of the team-a provider = %+v, want its 3 sandboxes (not the other provider's)", infos)
	}
	for _, in := range infos {
		for k := range in.Metadata {
			if k == "owner" || strings.HasPrefix(k, "workspace.esf.dev/") {
				t.Errorf("Info.Metadata of %s shows the adapter's key %q", in.ID, k)
			}
		}
		if in.ID == s.ID() && in.Metadata["purpose"] != "test" {
			t.Errorf("Info.Metadata = %v, want purpose=test", in.Metadata)
		}
	}

	// Attach, through another Provider, restores the working directory.
	_, q := newFake(t, osfake.Options{}, opensandbox.Config{BaseURL: srv.URL()})
	a, err := q.Attach(context.Background(), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Write(context.Background(), "rel.txt", []byte("r")); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read(context.Background(), "/work/dir/rel.txt"); err != nil || string(got) != "r" {
		t.Errorf("relative Write on an attached handle landed elsewhere: %q, %v", got, err)
	}
}

func TestOutputIsExact(t *testing.T) {
	_, p := newFake(t, osfake.Options{}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	for _, tc := range []struct{ cmd, out, err string }{
		{"printf a", "a", ""},
		{"printf ''", "", ""},
		{`printf '\n'`, "\n", ""},
		{`printf 'a\n\n'`, "a\n\n", ""},
		{`printf 'x\ny'; printf 'e' >&2`, "x\ny", "e"},
		{`printf '\n\nz'`, "\n\nz", ""},
		{`echo "tab	and 'quotes' \"x\""`, "tab\tand 'quotes' \"x\"\n", ""},
		{"printf 'esf-end-fake\\n'", "esf-end-fake\n", ""},
	} {
		res := run(t, s, tc.cmd)
		if string(res.Stdout) != tc.out || string(res.Stderr) != tc.err {
			t.Errorf("%s: stdout %q stderr %q, want %q %q", tc.cmd, res.Stdout, res.Stderr, tc.out, tc.err)
		}
	}
	// Streaming: a line reaches the writer, line end included, while the
	// command still runs (it then sleeps for far longer than lineHold).
	out := &lineWriter{marker: "first\n", seen: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := s.Run(context.Background(), sandbox.Spec{Stdout: out}, "echo first; sleep 3; printf last")
		done <- err
	}()
	select {
	case <-out.seen:
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	case err := <-done:
		t.Errorf("the first line (with its line end) was not streamed before the command ended (%v)", err)
	}
	if out.String() != "first\nlast" {
		t.Errorf("streamed %q", out.String())
	}
}

func TestSignalsAndStdin(t *testing.T) {
	srv, p := newFake(t, osfake.Options{}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	for cmd, code := range map[string]int{"kill -9 $$": 137, "kill -TERM $$": 143, "exit 3": 3} {
		if got := run(t, s, cmd).ExitCode; got != code {
			t.Errorf("%s: exit %d, want %d", cmd, got, code)
		}
	}
	n := srv.CommandsStarted()
	_, err := s.Run(context.Background(), sandbox.Spec{Stdin: strings.NewReader("x")}, "cat")
	if !errors.Is(err, workspace.ErrUnsupported) {
		t.Errorf("Run with Stdin = %v, want ErrUnsupported", err)
	}
	if srv.CommandsStarted() != n {
		t.Error("Run with Stdin started a command before refusing")
	}
}

// TestDollarPathsRefused: execd expands $NAME in paths, so the adapter
// refuses them rather than touch another file.
func TestDollarPathsRefused(t *testing.T) {
	_, p := newFake(t, osfake.Options{}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	if err := s.Write(context.Background(), "a$HOME", []byte("x")); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Write(a$HOME) = %v, want fs.ErrInvalid", err)
	}
	if _, err := s.Run(context.Background(), sandbox.Spec{WorkDir: "/tmp/$X"}, "pwd"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Run in /tmp/$X = %v, want fs.ErrInvalid", err)
	}
}

// TestServerProxyMode: with use_server_proxy the adapter forwards the
// endpoint's headers just the same.
func TestServerProxyMode(t *testing.T) {
	_, p := newFake(t, osfake.Options{}, opensandbox.Config{UseServerProxy: true})
	s := create(t, p, workspace.Spec{})
	if got := run(t, s, "echo via proxy").Stdout; string(got) != "via proxy\n" {
		t.Errorf("echo = %q", got)
	}
}

// TestUploadStreams moves a file several times the heap bound through
// Upload and Download and samples the heap meanwhile.
func TestUploadStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 64 MiB")
	}
	_, p := newFake(t, osfake.Options{}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	const size, bound = 64 << 20, 24 << 20
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
		}
	})
	err := s.Upload(context.Background(), "big.bin", io.LimitReader(zeros{}, size))
	var n int64
	if err == nil {
		var rc io.ReadCloser
		rc, err = s.Download(context.Background(), "big.bin")
		if err == nil {
			n, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
	}
	close(stop)
	wg.Wait()
	if err != nil || n != size {
		t.Fatalf("round trip: %d bytes, %v", n, err)
	}
	if grew := int64(peak.Load()) - int64(base.HeapInuse); grew > bound {
		t.Errorf("heap grew by %d MiB moving %d MiB: transfers are buffered", grew>>20, size>>20)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestLongFileName: the temporary sibling of a replace must stay within
// NAME_MAX however long the target's name is.
func TestLongFileName(t *testing.T) {
	_, p := newFake(t, osfake.Options{}, opensandbox.Config{})
	s := create(t, p, workspace.Spec{})
	name := strings.Repeat("n", 250)
	for _, data := range []string{"first", "second"} {
		if err := s.Write(context.Background(), name, []byte(data)); err != nil {
			t.Fatalf("Write of a 250-byte name: %v", err)
		}
		if got, err := s.Read(context.Background(), name); err != nil || string(got) != data {
			t.Errorf("Read = %q, %v; want %q", got, err, data)
		}
	}
}
