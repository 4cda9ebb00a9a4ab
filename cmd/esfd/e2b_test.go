package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	"github.com/esf-dev/esf/internal/testcert"
)

// TestE2BFrontDoorFlags: --e2b-addr serves E2B's control plane over TLS
// with the keys of --e2b-keys (401 without one), and stops with the
// daemon; the flags refuse incomplete combinations.
func TestE2BFrontDoorFlags(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	const key = "e2b_0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(keys, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := testcert.NewCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("e2b", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--e2b-addr", "127.0.0.1:0"}, // no keys
		{"--e2b-keys", keys},          // no address
		{"--e2b-addr", "127.0.0.1:0", "--e2b-keys", keys, "--e2b-tls-cert", pair.CertFile}, // no key
	} {
		full := append([]string{"esfd", "--state", filepath.Join(t.TempDir(), "s")}, args...)
		if err := root().Run(context.Background(), full); err == nil {
			t.Errorf("%q: no error", args)
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	state := filepath.Join(dir, "state")
	t.Setenv("ESF_SOCKET", "")
	t.Setenv("ESF_LOG_LEVEL", "error")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- root().Run(ctx, []string{"esfd", "--state", state, "--e2b-addr", addr, "--e2b-keys", keys,
			"--e2b-tls-cert", pair.CertFile, "--e2b-tls-key", pair.KeyFile})
	}()
	c := client.NewClient(filepath.Join(state, "esfd.sock"))
	defer c.Close()
	waitServing(t, c)

	pem, _ := os.ReadFile(ca.CertFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: time.Minute}
	get := func(k string) int {
		req, _ := http.NewRequest("GET", "https://"+addr+"/v2/sandboxes", nil)
		if k != "" {
			req.Header.Set("X-API-KEY", k)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := get(key); st != 200 {
		t.Fatalf("list with the key: %d", st)
	}
	if st := get(""); st != 401 {
		t.Fatalf("list without a key: %d", st)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatal("the front door still listens after the daemon stopped")
	}
}
