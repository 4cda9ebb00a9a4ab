package cubesandbox_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/cubesandbox"
	"github.com/esf-dev/esf/adapters/workspace/cubesandbox/cubefake"
	"github.com/esf-dev/esf/adapters/workspace/e2b"
	"github.com/esf-dev/esf/adapters/workspace/e2b/e2bfake"
	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
	"github.com/esf-dev/esf/workspace/workspacetest"
)

const key = "cube-test-key"

// recorder keeps the headers of every request, for checking what went on
// the wire.
type recorder struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req.Clone(context.Background()))
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func (r *recorder) find(pred func(*http.Request) bool) *http.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, q := range r.reqs {
		if pred(q) {
			return q
		}
	}
	return nil
}

// newCube starts a cubefake and a provider that reaches CubeProxy the way
// CUBE_PROXY_NODE_IP does: dialling the fake, naming the sandbox's host.
func newCube(t *testing.T, opts cubefake.Options, edit func(*cubesandbox.Config)) (*cubefake.Server, *e2b.Provider, *recorder) {
	t.Helper()
	if opts.APIKey == "" {
		opts.APIKey = key
	}
	opts.Dir = t.TempDir()
	srv, err := cubefake.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	rec := &recorder{}
	cfg := cubesandbox.Config{
		APIURL:       srv.URL + "/cubeapi/v1",
		APIKey:       opts.APIKey,
		Template:     "tpl-test",
		ProxyNodeIP:  srv.Addr(),
		PollInterval: 20 * time.Millisecond,
		HTTPClient:   &http.Client{Transport: rec},
	}
	if edit != nil {
		edit(&cfg)
	}
	p, err := cubesandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv, p, rec
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func create(t *testing.T, p workspace.Provider, spec workspace.Spec) workspace.Session {
	t.Helper()
	s, err := p.Create(ctxT(t), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// TestConformance runs the shared suite against the E2B adapter in its
// CubeSandbox profile and the Cube fake: asynchronous pause, connect 200,
// Bearer auth, virtual-host routing, traffic tokens under the cube- name.
func TestConformance(t *testing.T) {
	e2bfake.RequireJail(t)
	srv, p, _ := newCube(t, cubefake.Options{TrafficToken: true, PauseDelay: 150 * time.Millisecond, Templates: []string{"tpl-test"}}, nil)
	workspacetest.Run(t, workspacetest.Harness{
		Provider:  p,
		Spec:      workspace.Spec{Image: "tpl-test"},
		Sessions:  func(context.Context) (int, error) { return srv.Count(), nil },
		LargeFile: 256 << 20,
	})
	if n := srv.Processes(); n != 0 {
		t.Errorf("%d processes still running in the fake after the suite", n)
	}
}

// TestProfileOnTheWire: what the profile changes is what CubeSandbox
// expects: Bearer on the control plane, the sandbox's virtual host and
// both traffic-token headers on the data plane, user root.
func TestProfileOnTheWire(t *testing.T) {
	e2bfake.RequireJail(t)
	_, p, rec := newCube(t, cubefake.Options{TrafficToken: true}, nil)
	s := create(t, p, workspace.Spec{})
	res, err := s.Run(ctxT(t), sandbox.Spec{}, `echo "$HOME"; pwd`)
	if err != nil || string(res.Stdout) != "/root\n/root\n" {
		t.Fatalf("Run = %q, %v; want root's home", res.Stdout, err)
	}
	create := rec.find(func(r *http.Request) bool { return r.Method == "POST" && r.URL.Path == "/cubeapi/v1/sandboxes" })
	if create == nil || create.Header.Get("Authorization") != "Bearer "+key || create.Header.Get("X-API-Key") != "" {
		t.Errorf("create request auth: %v", create)
	}
	start := rec.find(func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/process.Process/Start") })
	if start == nil {
		t.Fatal("no Start request")
	}
	if want := "49983-" + s.ID() + ".cube.app"; start.Host != want {
		t.Errorf("Start Host = %q, want %q", start.Host, want)
	}
	tok := start.Header.Get("cube-traffic-access-token")
	if tok == "" || start.Header.Get("e2b-traffic-access-token") != tok || start.Header.Get("X-Access-Token") == "" {
		t.Errorf("Start headers lack tokens: %v", start.Header)
	}
	if a := start.Header.Get("Authorization"); a != "Basic cm9vdDo=" { // "root:"
		t.Errorf("Start user = %q, want root", a)
	}
}

// TestAsyncPause: Cube answers 204 before the sandbox is paused; Pause
// returns only once GET reads "paused", and a second handle's Pause during
// the transition (409) waits too.
func TestAsyncPause(t *testing.T) {
	srv, p, _ := newCube(t, cubefake.Options{PauseDelay: 400 * time.Millisecond}, nil)
	s := create(t, p, workspace.Spec{})
	other, err := p.Attach(ctxT(t), s.ID())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	start := time.Now()
	var wg sync.WaitGroup
	var otherErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(50 * time.Millisecond)
		otherErr = other.(workspace.Pauser).Pause(ctx)
	}()
	if err := s.(workspace.Pauser).Pause(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if otherErr != nil {
		t.Errorf("second handle's Pause = %v", otherErr)
	}
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("Pause returned after %v, before the sandbox was paused", took)
	}
	if srv.Calls("GET /sandboxes/{id}") < 2 {
		t.Errorf("Pause did not poll the state")
	}
	infos, err := p.Sessions(ctx)
	if err != nil || len(infos) != 1 || !infos[0].Paused {
		t.Errorf("Sessions after Pause = %+v, %v", infos, err)
	}
	if _, err := s.Read(ctx, "x"); !errors.Is(err, workspace.ErrPaused) {
		t.Errorf("Read while paused = %v", err)
	}
	// connect answers 200 even when it resumed.
	if err := other.(workspace.Pauser).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, "after", []byte("resumed")); err != nil {
		t.Errorf("Write through the first handle after the other resumed: %v", err)
	}
}

// TestRateLimitWithoutRetryAfter: CubeAPI's 429 has no Retry-After; the
// adapter backs off and retries idempotent calls.
func TestRateLimitWithoutRetryAfter(t *testing.T) {
	srv, p, _ := newCube(t, cubefake.Options{}, nil)
	s := create(t, p, workspace.Spec{})
	srv.RateLimit(2)
	if _, err := p.Attach(ctxT(t), s.ID()); err != nil {
		t.Fatalf("Attach through two 429s: %v", err)
	}
	srv.RateLimit(10)
	_, err := p.Attach(ctxT(t), s.ID())
	var pe *workspace.ProviderError
	if !errors.Is(err, workspace.ErrPolicy) || !errors.As(err, &pe) || pe.Provider != "cubesandbox" || pe.Status != 429 {
		t.Errorf("exhausted retries = %v", err)
	}
	srv.RateLimit(0)
}

// TestListIgnoresFilters: CubeAPI's list ignores the metadata filter, so a
// Create whose answer is lost must check the token itself before killing.
func TestListIgnoresFilters(t *testing.T) {
	srv, p, _ := newCube(t, cubefake.Options{CreateDelay: 500 * time.Millisecond}, func(c *cubesandbox.Config) {
		c.CleanupTimeout = 150 * time.Millisecond
	})
	keep := create(t, p, workspace.Spec{})
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
		t.Errorf("the unrelated sandbox was killed: %v", err)
	}
}

// TestUnknownTemplate: a 404 naming a template is not a missing session.
func TestUnknownTemplate(t *testing.T) {
	_, p, _ := newCube(t, cubefake.Options{Templates: []string{"tpl-test"}}, nil)
	_, err := p.Create(ctxT(t), workspace.Spec{Image: "nope"})
	var pe *workspace.ProviderError
	if err == nil || errors.Is(err, workspace.ErrNotFound) || !errors.Is(err, workspace.ErrProvider) || !errors.As(err, &pe) || pe.Status != 404 {
		t.Errorf("Create with an unknown template = %v", err)
	}
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   cubesandbox.Config
		check func(e2b.Config) bool
		bad   bool
	}{
		{"no template", cubesandbox.Config{}, nil, true},
		{"defaults", cubesandbox.Config{Template: "t"}, func(c e2b.Config) bool {
			return c.APIURL == "http://127.0.0.1:3000" && c.Domain == "cube.app" && c.EnvdScheme == "http" &&
				c.ProxyPort == 0 && c.User == "root" && c.BearerAuth && c.Name == "cubesandbox" && len(c.TrafficTokenHeaders) == 2
		}, false},
		{"node ip gets the proxy port", cubesandbox.Config{Template: "t", ProxyNodeIP: "10.0.0.7", ProxyPort: 8080}, func(c e2b.Config) bool {
			return c.ProxyAddr == "10.0.0.7:8080" && c.ProxyPort == 8080
		}, false},
		{"443 means https", cubesandbox.Config{Template: "t", ProxyPort: 443}, func(c e2b.Config) bool {
			return c.EnvdScheme == "https" && c.ProxyPort == 0
		}, false},
		{"bad scheme", cubesandbox.Config{Template: "t", ProxyScheme: "ftp"}, nil, true},
	} {
		c, err := tc.cfg.E2B()
		if tc.bad != (err != nil) || tc.check != nil && !tc.check(c) {
			t.Errorf("%s: E2B() = %+v, %v", tc.name, c, err)
		}
	}
}

func TestConfigFromEnvFallsBack(t *testing.T) {
	t.Setenv("CUBE_API_URL", "")
	t.Setenv("CUBE_API_KEY", "")
	t.Setenv("E2B_API_URL", "http://cube.internal:3000")
	t.Setenv("E2B_API_KEY", "k")
	t.Setenv("CUBE_TEMPLATE_ID", "tpl")
	t.Setenv("CUBE_PROXY_PORT_HTTP", "8081")
	t.Setenv("CUBE_TIMEOUT", "90")
	c := cubesandbox.ConfigFromEnv()
	if c.APIURL != "http://cube.internal:3000" || c.APIKey != "k" || c.Template != "tpl" || c.ProxyPort != 8081 || c.Timeout != 90*time.Second {
		t.Errorf("ConfigFromEnv = %+v", c)
	}
	t.Setenv("CUBE_API_URL", "http://cube:3000")
	if c := cubesandbox.ConfigFromEnv(); c.APIURL != "http://cube:3000" {
		t.Errorf("CUBE_API_URL does not win: %q", c.APIURL)
	}
}
