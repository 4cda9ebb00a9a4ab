package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/internal/testcert"
	"github.com/esf-dev/esf/journal"
	journaletcd "github.com/esf-dev/esf/journal/etcd"
)

// TestServeOnEtcdAndNetwork runs the daemon in process with its journal on
// a TLS etcd cluster with auth (--journal etcds://... and the --etcd-*
// flags) and its API on a TLS network listener with a token (--listen,
// --tls-cert, --tls-key, --tokens): a remote client creates a group, and
// the group is in etcd under the prefix.
func TestServeOnEtcdAndNetwork(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1, NoFsync: true, TLS: true})
	ctx := context.Background()
	admin := c.Client(t)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.RoleAdd(ctx, "esf"))
	must(admin.RoleGrantPermission(ctx, "esf", "/w1/", clientv3.GetPrefixRangeEnd("/w1/"), clientv3.PermissionType(clientv3.PermReadWrite)))
	must(admin.UserAdd(ctx, "esf", "pw-0123456789"))
	must(admin.UserGrantRole(ctx, "esf", "esf"))
	must(admin.UserAdd(ctx, "root", "root-pw"))
	must(admin.UserGrantRole(ctx, "root", "root"))
	must(admin.AuthEnable(ctx))

	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("pw-0123456789\n"), 0o600)
	ca, err := testcert.NewCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue("esfd", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("network-token-0123456789\n"), 0o600)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	state := filepath.Join(dir, "state")
	t.Setenv("ESF_SOCKET", "")
	t.Setenv("ESF_LOG_LEVEL", "error")
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- root().Run(sctx, []string{"esfd", "--state", state,
			"--journal", c.URL("w1"), "--etcd-ca", c.CAFile, "--etcd-cert", c.ClientCert.CertFile, "--etcd-key", c.ClientCert.KeyFile,
			"--etcd-user", "esf", "--etcd-password-file", pw,
			"--listen", "tcp://" + addr, "--tls-cert", pair.CertFile, "--tls-key", pair.KeyFile, "--tokens", tokens})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	cfg, err := client.ClientTLS(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.NewRemoteClient(client.RemoteOptions{Host: "https://" + addr, Token: "network-token-0123456789", TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := cl.Status(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("daemon not answering on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644)
	imp, err := cl.Import(ctx, src, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := cl.CreateGroup(ctx, v1.CreateGroupRequest{RootID: imp.RootID.String()}, client.CallOptions{})
	if err != nil {
		t.Fatal(err)
	}

	o, err := journaletcd.Config{URL: c.URL("w1"), CAFile: c.CAFile, CertFile: c.ClientCert.CertFile, KeyFile: c.ClientCert.KeyFile,
		User: "esf", PasswordFile: pw}.Options()
	if err != nil {
		t.Fatal(err)
	}
	s, err := journaletcd.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.View(ctx, func(r journal.Reader) error {
		_, err := journal.GetGroup(r, g.Group.GroupID)
		return err
	}); err != nil {
		t.Fatalf("the group in etcd: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "journal")); err == nil {
		t.Error("a pebble journal was made in the state dir too")
	}
}

// TestNetworkFlagErrors: esfd refuses an open network listener, TLS
// flags without --listen, and a journal it cannot name.
func TestNetworkFlagErrors(t *testing.T) {
	t.Setenv("ESF_SOCKET", "")
	t.Setenv("ESF_LOG_LEVEL", "error")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "tcp://0.0.0.0:0", "--tokens", "/nonexistent"}, "tokens"},
		{[]string{"--listen", "tcp://127.0.0.1:0"}, "no --tokens"},
		{[]string{"--tls-cert", "/x.pem", "--tls-key", "/x-key.pem"}, "--listen"},
		{[]string{"--journal", "zookeeper://h/x"}, "--journal"},
		{[]string{"--journal", "etcd://127.0.0.1:1/x", "--etcd-ca", "/ca.pem"}, "etcds://"},
	} {
		err := root().Run(context.Background(), append([]string{"esfd", "--state", filepath.Join(t.TempDir(), "s")}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
}
