package fabric

import (
	"os"
	"strings"
	"sync"
	"testing"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/esf-dev/esf/cas"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/internal/s3test"
	"github.com/esf-dev/esf/internal/testenv"
)

// ESF_FABRIC_CAS_REMOTE=1 opens the test fabrics on a remote content store
// (the FR tests that involve content, through the verified cache, as
// e2e's ESF_E2E_CAS_REMOTE=1 does for the daemons): testOptions gives an
// Options without a remote of its own a cas/s3 store on a versitygw of the
// test's, so Open tiers its local store in front of it (cas/tier), with a
// prefix per state dir (a fabric reopened on its state dir finds its
// content again). make test runs `go test ./fabric -run TestFR` so.
func testOptions(t testing.TB, o Options) Options {
	t.Helper()
	if os.Getenv("ESF_FABRIC_CAS_REMOTE") == "" || o.Remote != nil {
		return o
	}
	srv, bucket := testRemoteServer(t)
	c := awss3.New(srv.Client().Options(), s3store.ClientOptions)
	st, err := s3store.New(s3store.Options{Client: c, Bucket: bucket,
		Prefix: cas.Sum([]byte(o.StateDir)).Short(), TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	o.Remote = st
	return o
}

// testRemoteServer is the versitygw and bucket of t's top-level test,
// started on first use and stopped when the test (or subtest) that started
// it ends.
func testRemoteServer(t testing.TB) (*s3test.Server, string) {
	t.Helper()
	testenv.Require(t, "s3")
	top, _, _ := strings.Cut(t.Name(), "/")
	remoteServers.mu.Lock()
	defer remoteServers.mu.Unlock()
	if s, ok := remoteServers.m[top]; ok {
		return s.srv, s.bucket
	}
	srv, err := s3test.StartServer()
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := srv.NewBucket(t.Context())
	if err != nil {
		srv.Stop()
		t.Fatal(err)
	}
	if remoteServers.m == nil {
		remoteServers.m = map[string]remoteServer{}
	}
	remoteServers.m[top] = remoteServer{srv, bucket}
	t.Cleanup(func() {
		remoteServers.mu.Lock()
		delete(remoteServers.m, top)
		remoteServers.mu.Unlock()
		srv.Stop()
	})
	return srv, bucket
}

type remoteServer struct {
	srv    *s3test.Server
	bucket string
}

var remoteServers struct {
	mu sync.Mutex
	m  map[string]remoteServer
}

// TestCASRemoteSwitch: under ESF_FABRIC_CAS_REMOTE=1 (make test runs it
// with the FR tests) the tests' fabrics really are on the remote store: a
// group's root is in the bucket.
func TestCASRemoteSwitch(t *testing.T) {
	if os.Getenv("ESF_FABRIC_CAS_REMOTE") == "" {
		t.Skip("ESF_FABRIC_CAS_REMOTE is not set")
	}
	requireMounts(t)
	f := openGraph(t)
	if f.tier == nil || f.opts.Remote == nil {
		t.Fatal("openGraph's fabric has no remote content store")
	}
	g := newGroup(t, f, map[string]string{"a": "on the remote"})
	root, err := cas.ParseID(g.Node.RootID)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := f.opts.Remote.Has(t.Context(), root); !ok || err != nil {
		t.Fatalf("the group's root %s in the bucket: %v %v", root.Short(), ok, err)
	}
}
