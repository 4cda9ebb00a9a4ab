package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/api/client"
	"github.com/esf-dev/esf/cas"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/internal/s3test"
)

// TestServeWithCASRemote runs the daemon with --cas-remote on versitygw
// (credentials from the standard AWS variables): an import is answered
// only once its objects are in the bucket.
func TestServeWithCASRemote(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	ctx := context.Background()
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("ESF_LOG_LEVEL", "error")
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	socket := filepath.Join(dir, "esfd.sock")
	t.Setenv("ESF_SOCKET", "")
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- root().Run(sctx, []string{"esfd", "--state", state, "--socket", socket,
			"--cas-remote", srv.URL(bucket, "w1"), "--remote-durability", "sync", "--cache-size", "1G"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	cl := client.NewClient(socket)
	defer cl.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			done <- err // for the deferred wait
			t.Fatalf("serve ended: %v", err)
		default:
		}
		if _, err := cl.Status(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("daemon not answering: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "f"), []byte("in the bucket"), 0o644)
	if _, err := cl.Import(ctx, src, client.CallOptions{}); err != nil {
		t.Fatal(err)
	}
	remote, err := s3store.New(s3store.Options{Client: srv.Client(), Bucket: bucket, Prefix: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := remote.Has(ctx, cas.Sum([]byte("in the bucket"))); !ok || err != nil {
		t.Fatalf("the imported file is not in the bucket: %v, %v", ok, err)
	}
}

func TestCASRemoteFlagErrors(t *testing.T) {
	t.Setenv("ESF_SOCKET", "")
	t.Setenv("ESF_LOG_LEVEL", "error")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cas-remote", "http://bucket/x"}, "--cas-remote"},
		{[]string{"--cas-remote", "s3://b/x?endpoint=http://127.0.0.1:1&bogus=1"}, "bogus"},
		{[]string{"--cas-remote", "s3://b/x?endpoint=http://127.0.0.1:1", "--remote-durability", "later"}, "sync or async"},
		{[]string{"--cache-size", "10G"}, "--cas-remote"},
		{[]string{"--cas-remote", "s3://b/x?endpoint=http://127.0.0.1:1", "--cache-size", "lots"}, "--cache-size"},
	} {
		err := root().Run(context.Background(), append([]string{"esfd", "--state", filepath.Join(t.TempDir(), "s")}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error about %s", tc.args, err, tc.want)
		}
		if errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
}
