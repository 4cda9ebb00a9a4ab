package etcd_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/etcd"
)

// TestTLSAndAuth opens the journal the way esfd --journal etcds://... with
// --etcd-ca, --etcd-cert, --etcd-key, --etcd-user and --etcd-password-file
// does, on a cluster that serves TLS and has auth enabled, as a user whose
// role may read and write only its prefix: the journal works (reads,
// commits, staged commits, events, the watch), a wrong password or
// another prefix is refused as failed_precondition, and a client that
// does not trust the cluster's CA cannot connect.
func TestTLSAndAuth(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 1, NoFsync: true, TLS: true})
	ctx := context.Background()
	root := c.Client(t)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(root.RoleAdd(ctx, "esf"))
	must(root.RoleGrantPermission(ctx, "esf", "/tenant/", clientv3.GetPrefixRangeEnd("/tenant/"), clientv3.PermissionType(clientv3.PermReadWrite)))
	must(root.UserAdd(ctx, "esf", "s3cret-password"))
	must(root.UserGrantRole(ctx, "esf", "esf"))
	must(root.UserAdd(ctx, "root", "root-password"))
	must(root.UserGrantRole(ctx, "root", "root"))
	must(root.AuthEnable(ctx))

	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	bad := filepath.Join(dir, "bad")
	os.WriteFile(pw, []byte("s3cret-password\n"), 0o600)
	os.WriteFile(bad, []byte("guess\n"), 0o600)
	open := func(prefix, passwordFile, caFile string) (*etcd.Store, error) {
		o, err := etcd.Config{URL: c.URL(prefix), CAFile: caFile, CertFile: c.ClientCert.CertFile, KeyFile: c.ClientCert.KeyFile,
			User: "esf", PasswordFile: passwordFile}.Options()
		if err != nil {
			t.Fatal(err)
		}
		o.Failpoint = func(string) error { return nil }
		o.DialTimeout = 3 * time.Second
		return etcd.Open(ctx, o)
	}

	s, err := open("tenant", pw, c.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ch := s.Notify()
	mustUpdate(t, s, func(tx journal.Tx) error {
		for i := range 300 { // staged: beyond one request
			if err := tx.Put([]byte{'k', byte(i >> 8), byte(i)}, []byte("v")); err != nil {
				return err
			}
		}
		return tx.AppendEvent(journal.Event{Type: "test.tls"})
	})
	<-ch
	if n := len(scanKeys(t, s, "k")); n != 300 {
		t.Fatalf("%d keys, want 300", n)
	}
	if err := s.FlushEvents(ctx); err != nil {
		t.Fatal(err)
	}
	if seq, err := journal.LastSeq(ctx, s); err != nil || seq != 1 {
		t.Fatalf("LastSeq %d, %v", seq, err)
	}
	if _, err := s.Maintain(ctx, 1); err != nil { // compaction refused to this user: not an error
		t.Fatalf("maintenance as a user without root: %v", err)
	}

	if _, err := open("tenant", bad, c.CAFile); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("wrong password: %v, want failed_precondition", err)
	}
	if _, err := open("other", pw, c.CAFile); !errors.Is(err, journal.ErrFailedPrecondition) {
		t.Errorf("a prefix the role does not cover: %v, want failed_precondition", err)
	}
	if _, err := open("tenant", pw, ""); err == nil {
		t.Error("a client that trusts only the system's roots connected")
	}
}
