package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/testcert"
)

// network, when set, makes the test servers (newHarness, fakeServe,
// runcAttempt) also listen on a loopback TCP port with TLS and bearer
// tokens, and hands the tests a client of that port instead of the socket:
// TestEveryEndpointOverTheNetwork runs the client-driven tests that way.
var network *netSetup

// netSetup is a CA, a server certificate for 127.0.0.1 and a token file.
type netSetup struct {
	ca        *testcert.CA
	server    testcert.Pair
	tokenFile string
	token     string
}

func newNetSetup(t *testing.T) *netSetup {
	t.Helper()
	dir := t.TempDir()
	ca, err := testcert.NewCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("esfd", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	n := &netSetup{ca: ca, server: pair, tokenFile: filepath.Join(dir, "tokens"), token: "tok-0123456789abcdef-first"}
	if err := os.WriteFile(n.tokenFile, []byte("# esfd tokens\n\n"+n.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return n
}

// listen opens the TLS listener with the token file.
func (n *netSetup) listen(t *testing.T) net.Listener {
	t.Helper()
	cfg, err := ServerTLS(n.server.CertFile, n.server.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := LoadTokens(n.tokenFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := ListenTCP("tcp://127.0.0.1:0", NetworkOptions{TLS: cfg, Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// client is a client of ln with token (TLS verified against the CA).
func (n *netSetup) client(t *testing.T, ln net.Listener, token string) *client.Client {
	t.Helper()
	cfg, err := client.ClientTLS(n.ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewRemoteClient(client.RemoteOptions{Host: "https://" + ln.Addr().String(), Token: token, TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// rawClient reaches the server a Client talks to without it: the
// base URL of its requests and, on the unix socket, an http.Client.
type rawClient struct {
	base string
	hc   *http.Client
}

// rawClients maps each client serveTest made to its rawClient.
var rawClients sync.Map

func rawOf(c *client.Client) rawClient {
	r, _ := rawClients.Load(c)
	return r.(rawClient)
}

// serveTest serves s on a unix socket at sock (and on the network, see
// network) and returns a client: of the network listener if there is one.
func serveTest(t *testing.T, s *Server, sock string, grace time.Duration) (*client.Client, context.CancelFunc, <-chan error) {
	t.Helper()
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	lns := []net.Listener{ln}
	c := client.NewClient(sock)
	raw := rawClient{base: "http://esfd", hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}}
	if network != nil {
		nl := network.listen(t)
		lns = append(lns, nl)
		c = network.client(t, nl, network.token)
		raw.base = "https://" + nl.Addr().String()
	}
	rawClients.Store(c, raw)
	t.Cleanup(func() { rawClients.Delete(c); raw.hc.CloseIdleConnections() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeAll(ctx, grace, lns...) }()
	return c, cancel, done
}

// TestEveryEndpointOverTheNetwork runs every test that drives the API
// through the Client again with the Client on the network listener (TLS,
// a bearer token): JSON calls, tar uploads and downloads with trailers,
// event streams and follows, and the full-duplex exec form (stdin, a
// terminal, cancellation), against fakes and a real runc container.
func TestEveryEndpointOverTheNetwork(t *testing.T) {
	network = newNetSetup(t)
	t.Cleanup(func() { network = nil })
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"RoundTripThroughClient", TestRoundTripThroughClient},
		{"ClientErrorsKeepTheirClass", TestClientErrorsKeepTheirClass},
		{"ExportTarFailsMidStream", TestExportTarFailsMidStream},
		{"TraceAndIdempotencyReachTheRequest", TestTraceAndIdempotencyReachTheRequest},
		{"ClientReusesItsConnection", TestClientReusesItsConnection},
		{"GraphEndpoints", TestGraphEndpoints},
		{"IdempotencyOverHTTP", TestIdempotencyOverHTTP},
		{"AttemptEndpoints", TestAttemptEndpoints},
		{"CollectEndpoint", TestCollectEndpoint},
		{"MergeDiffPatch", TestMergeDiffPatch},
		{"ProvenanceEndpoints", TestProvenanceEndpoints},
		{"EventsListAndFilter", TestEventsListAndFilter},
		{"EventsFollow", TestEventsFollow},
		{"EventsFollowEndsOnShutdown", TestEventsFollowEndsOnShutdown},
		{"ExecIOShutdown", TestExecIOShutdown},
		{"ExecIOStdinRoundTrip", TestExecIOStdinRoundTrip},
		{"ExecIOTerminal", TestExecIOTerminal},
		{"ExecIOCancelKills", TestExecIOCancelKills},
		{"ExecIOErrorBeforeStart", TestExecIOErrorBeforeStart},
		{"ExecIORunc", TestExecIORunc},
	} {
		t.Run(tc.name, tc.fn)
	}
}

// TestNetworkAuth: a request on the network listener without a valid
// bearer token is 401 with the API's error body, code unauthenticated; the
// token file is read again when it changes (a token added, one revoked,
// the file emptied or removed: fail closed); the unix socket of the same
// server needs no token.
func TestNetworkAuth(t *testing.T) {
	n := newNetSetup(t)
	network = n
	h := newHarness(t, 5*time.Second)
	network = nil
	base := rawOf(h.client).base
	roots := x509.NewCertPool()
	pem, _ := os.ReadFile(n.ca.CertFile)
	roots.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer hc.CloseIdleConnections()
	get := func(hdr ...string) (int, errdefs.Code, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/status", nil)
		for _, v := range hdr {
			req.Header.Add("Authorization", v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e errdefs.Error
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatalf("status %d with a body that is not the API's error: %q", resp.StatusCode, b)
			}
		}
		return resp.StatusCode, e.Code, resp.Header
	}
	refused := func(what string, hdr ...string) {
		t.Helper()
		status, code, h := get(hdr...)
		if status != http.StatusUnauthorized || code != errdefs.CodeUnauthenticated || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: %d %q (challenge %q), want 401 unauthenticated with a Bearer challenge", what, status, code, h.Get("WWW-Authenticate"))
		}
	}
	accepted := func(what string, hdr ...string) {
		t.Helper()
		if status, code, _ := get(hdr...); status != http.StatusOK {
			t.Errorf("%s: %d %q, want 200", what, status, code)
		}
	}
	accepted("the token", "Bearer "+n.token)
	accepted("the scheme in another case", "bearer "+n.token)
	refused("no header")
	refused("a wrong token", "Bearer tok-0123456789abcdef-wrong")
	refused("a prefix of the token", "Bearer "+n.token[:len(n.token)-1])
	refused("the token twice", "Bearer "+n.token, "Bearer "+n.token)
	refused("another scheme", "Basic "+n.token)
	refused("an empty token", "Bearer ")
	// The error is the API's: the client maps it to its class.
	anon, err := client.NewRemoteClient(client.RemoteOptions{Host: base, TLS: &tls.Config{RootCAs: roots}})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Status(context.Background()); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("client without a token: %v, want unauthenticated", err)
	}

	// Rotation: a second token added, then the first revoked.
	second := "tok-fedcba9876543210-second"
	write := func(content string) {
		t.Helper()
		tmp := n.tokenFile + ".new"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, n.tokenFile); err != nil {
			t.Fatal(err)
		}
	}
	write(n.token + "\n" + second + "\n")
	accepted("a token added to the file", "Bearer "+second)
	accepted("the first token still", "Bearer "+n.token)
	write(second + "\n")
	refused("a revoked token", "Bearer "+n.token)
	accepted("the remaining token", "Bearer "+second)
	// Edited in place (same inode), not renamed over.
	if err := os.WriteFile(n.tokenFile, []byte(n.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	accepted("a token after an edit in place", "Bearer "+n.token)
	write("# nobody\n")
	refused("an emptied file", "Bearer "+n.token)
	write("short\n")
	refused("a file with a malformed token", "Bearer "+n.token)
	if err := os.Remove(n.tokenFile); err != nil {
		t.Fatal(err)
	}
	refused("a removed file", "Bearer "+n.token)
	write(n.token + "\n")
	accepted("the file back", "Bearer "+n.token)

	// The unix socket of the same server needs no token.
	if _, err := client.NewClient(h.socket).Status(context.Background()); err != nil {
		t.Errorf("unix socket: %v", err)
	}
	// The refusals are logged, the token never.
	if logs := h.logs.String(); !strings.Contains(logs, "request refused") || strings.Contains(logs, n.token) {
		t.Errorf("server log: refusals logged %v, token leaked %v", strings.Contains(logs, "request refused"), strings.Contains(logs, n.token))
	}
}

// TestListenTCPRefusesAnOpenDoor: a network listener needs tokens, and TLS
// unless it is loopback, or the operator's explicit Insecure.
func TestListenTCPRefusesAnOpenDoor(t *testing.T) {
	n := newNetSetup(t)
	toks, err := LoadTokens(n.tokenFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ServerTLS(n.server.CertFile, n.server.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		o    NetworkOptions
		ok   bool
	}{
		{"tcp://127.0.0.1:0", NetworkOptions{}, false},
		{"tcp://127.0.0.1:0", NetworkOptions{Tokens: toks}, true},
		{"tcp://[::1]:0", NetworkOptions{Tokens: toks}, true},
		{"tcp://localhost:0", NetworkOptions{Tokens: toks}, true},
		{"tcp://0.0.0.0:0", NetworkOptions{Tokens: toks}, false},
		{"tcp://:0", NetworkOptions{Tokens: toks}, false},
		{"tcp://192.0.2.1:0", NetworkOptions{Tokens: toks}, false},
		{"tcp://0.0.0.0:0", NetworkOptions{TLS: cfg}, false},
		{"tcp://127.0.0.1:0", NetworkOptions{TLS: cfg, Tokens: toks}, true},
		{"tcp://127.0.0.1:0", NetworkOptions{Insecure: true}, true},
		{"127.0.0.1:0", NetworkOptions{Tokens: toks}, false},
		{"unix:///x", NetworkOptions{Tokens: toks}, false},
	} {
		ln, err := ListenTCP(tc.addr, tc.o)
		if ln != nil {
			ln.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("ListenTCP(%s, tls=%v tokens=%v insecure=%v): %v, want ok=%v", tc.addr, tc.o.TLS != nil, tc.o.Tokens != nil, tc.o.Insecure, err, tc.ok)
		}
		if err != nil && !tc.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ListenTCP(%s): %v, want invalid_argument", tc.addr, err)
		}
	}
	if _, err := LoadTokens(filepath.Join(t.TempDir(), "none"), nil); err == nil {
		t.Error("LoadTokens of a missing file succeeded")
	}
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, []byte("# no tokens yet\n"), 0o600)
	if _, err := LoadTokens(empty, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("LoadTokens of a file without tokens: %v, want invalid_argument", err)
	}
}

// TestNetworkTLS: the client verifies the daemon's certificate (an
// unknown CA or a plain-text client fails, unavailable), and a renewed
// certificate is served to new connections without a restart.
func TestNetworkTLS(t *testing.T) {
	n := newNetSetup(t)
	network = n
	h := newHarness(t, 5*time.Second)
	network = nil
	ctx := context.Background()
	addr := strings.TrimPrefix(rawOf(h.client).base, "https://")
	strange, err := testcert.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := client.ClientTLS(strange.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		o    client.RemoteOptions
		want error
	}{
		"unknown CA":  {client.RemoteOptions{Host: "https://" + addr, Token: n.token, TLS: cfg}, errdefs.ErrUnavailable},
		"system root": {client.RemoteOptions{Host: "https://" + addr, Token: n.token}, errdefs.ErrUnavailable},
		// Go's TLS server answers a plain request with a plain 400.
		"plain text": {client.RemoteOptions{Host: "http://" + addr, Token: n.token}, errdefs.ErrInvalidArgument},
	} {
		c, err := client.NewRemoteClient(tc.o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Status(ctx); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
		c.Close()
	}
	serialOf := func() string {
		t.Helper()
		roots := x509.NewCertPool()
		pem, _ := os.ReadFile(n.ca.CertFile)
		roots.AppendCertsFromPEM(pem)
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serialOf()
	if _, err := n.ca.Issue("esfd", "127.0.0.1"); err != nil { // rewrites the pair in place
		t.Fatal(err)
	}
	if after := serialOf(); after == before {
		t.Errorf("still serving certificate %s after it was renewed", before)
	}
	if _, err := h.client.Status(ctx); err != nil {
		t.Errorf("after the renewal: %v", err)
	}
	for _, bad := range []string{"esfd:7777", "https://h", "ftp://h:1", "https://u:p@h:1", "https://h:1/x"} {
		if _, err := client.NewRemoteClient(client.RemoteOptions{Host: bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("host %q: %v, want invalid_argument", bad, err)
		}
	}
}
