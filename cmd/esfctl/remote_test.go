package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/testcert"
)

// remoteDaemon serves a real Fabric on a unix socket and on a loopback
// TLS listener with a token, in process, and returns the https address,
// the CA file and a token file.
func remoteDaemon(t *testing.T) (host, caFile, tokenFile string) {
	t.Helper()
	dir := t.TempDir()
	ca, err := testcert.NewCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("esfd", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	tokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("esfctl-test-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := fabric.Open(context.Background(), fabric.Options{StateDir: filepath.Join(dir, "state")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := api.Listen(filepath.Join(dir, "esfd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := api.ServerTLS(pair.CertFile, pair.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := api.LoadTokens(tokenFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	nl, err := api.ListenTCP("tcp://127.0.0.1:0", api.NetworkOptions{TLS: cfg, Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- api.NewServer(f, api.ServerOptions{}).ServeAll(ctx, 5*time.Second, []net.Listener{ln, nl}...)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		f.Close()
	})
	return "https://" + nl.Addr().String(), ca.CertFile, tokenFile
}

// TestRemoteHost drives esfd's network API with --host, --token-file and
// --cacert (and their environment variables): no socket is involved (the
// one given does not exist). A missing token is exit status 12
// (unauthenticated), an unknown CA 11 (unavailable).
func TestRemoteHost(t *testing.T) {
	host, ca, tok := remoteDaemon(t)
	nosock := filepath.Join(t.TempDir(), "none.sock")
	remote := []string{"--host", host, "--token-file", tok, "--cacert", ca}
	run := func(args ...string) result {
		t.Helper()
		return esfctl(t, nosock, nil, append(append([]string(nil), remote...), args...)...)
	}
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a.txt"), []byte("over the network"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run("-o", "json", "group", "create", "--from", src)
	if r.status != 0 {
		t.Fatalf("group create: %d %s", r.status, r.stderr)
	}
	var g fabric.CreateGroupResult
	if err := json.Unmarshal([]byte(r.stdout), &g); err != nil {
		t.Fatal(err)
	}
	if r := run("fork", g.Node.NodeID, "-n", "2"); r.status != 0 || strings.Count(r.stdout, "node_") != 2 {
		t.Fatalf("fork: %d %q %s", r.status, r.stdout, r.stderr)
	}
	tarFile := filepath.Join(t.TempDir(), "n.tar")
	if r := run("export", g.Node.NodeID, "--to", tarFile); r.status != 0 {
		t.Fatalf("export to a local tar: %d %s", r.status, r.stderr)
	}
	if fi, err := os.Stat(tarFile); err != nil || fi.Size() < 1024 {
		t.Fatalf("exported tar: %v", err)
	}
	if r := run("events"); r.status != 0 || !strings.Contains(r.stdout, "node.forked") {
		t.Fatalf("events: %d %s", r.status, r.stderr)
	}

	t.Setenv("ESF_HOST", host)
	t.Setenv("ESF_TOKEN_FILE", tok)
	t.Setenv("ESF_CACERT", ca)
	if r := esfctl(t, nosock, nil, "status"); r.status != 0 {
		t.Fatalf("status with ESF_HOST, ESF_TOKEN_FILE, ESF_CACERT: %d %s", r.status, r.stderr)
	}

	t.Setenv("ESF_TOKEN_FILE", "")
	r = esfctl(t, nosock, nil, "-o", "json", "status")
	if e := jsonError(t, r); r.status != 12 || e.Code != errdefs.CodeUnauthenticated {
		t.Errorf("without a token: exit %d, %+v; want 12 unauthenticated", r.status, e)
	}
	other, err := testcert.NewCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("ESF_TOKEN_FILE", tok)
	t.Setenv("ESF_CACERT", other.CertFile)
	r = esfctl(t, nosock, nil, "-o", "json", "status")
	if e := jsonError(t, r); r.status != 11 || e.Code != errdefs.CodeUnavailable {
		t.Errorf("with an unknown CA: exit %d, %+v; want 11 unavailable", r.status, e)
	}
	if r := esfctl(t, nosock, nil, "--host", "esfd:7777", "status"); r.status != 2 {
		t.Errorf("--host without a scheme: exit %d, want 2", r.status)
	}
}
