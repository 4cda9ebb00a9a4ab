package e2e

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/internal/s3test"
)

// TestRestoreFromRemote: esfd A with --cas-remote seals a checkpoint; a
// new esfd B with A's journal and an empty cache activates it, and its
// projection server (a child with --cas-remote) fetches only what is read;
// B's export equals A's, and esfctl fsck --remote finds the bucket whole.
func TestRestoreFromRemote(t *testing.T) {
	requireFUSE(t)
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	remote := []string{"--cas-remote", srv.URL(bucket, "e2e")}

	a := startDaemonWith(t, "", remote...)
	files := map[string]string{"top.txt": "top\n"}
	for _, d := range []string{"x", "y", "z"} {
		for _, f := range []string{"1", "2", "3", "4"} {
			files[d+"/"+f+".txt"] = strings.Repeat(d+f, 100)
		}
	}
	g := createGroup(t, a, smallTree(t, a, files))
	at := activate(t, a, g.Node.NodeID)
	writeFile(t, filepath.Join(at.Root, "y", "new.txt"), "new in the attempt\n")
	s := suspend(t, a, at.AttemptID)
	node := s.Node.NodeID
	outA := filepath.Join(t.TempDir(), "a")
	a.mustCtl(nil, "export", node, "--to", outA)
	a.stop()

	stateB := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(stateB, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", filepath.Join(a.state, "journal"), filepath.Join(stateB, "journal")).CombinedOutput(); err != nil {
		t.Fatalf("copy journal: %v: %s", err, out)
	}
	b := startDaemonWith(t, stateB, remote...)
	bt := activate(t, b, node)
	if got := readFile(t, filepath.Join(bt.Root, "y", "new.txt")); got != "new in the attempt\n" {
		t.Fatalf("B's attempt shows %q", got)
	}
	if got := readFile(t, filepath.Join(bt.Root, "x", "2.txt")); got != files["x/2.txt"] {
		t.Fatalf("B's attempt shows %q", got)
	}
	// Root tree, x's and y's trees, two blobs: 5 objects of the 17.
	if n := cached(t, stateB); n > 5 {
		t.Fatalf("B's cache holds %d objects after reading 2 files, want at most 5", n)
	}
	b.mustCtl(nil, "release", bt.AttemptID)
	outB := filepath.Join(t.TempDir(), "b")
	b.mustCtl(nil, "export", node, "--to", outB)
	compareTrees(t, outA, outB)
	// Every object the graph reaches is in the bucket and whole.
	if r := b.mustCtl(nil, "fsck", "--remote"); !strings.HasPrefix(r.stdout, "checked ") || strings.Contains(r.stdout, "missing") {
		t.Fatalf("fsck --remote: %s", r.stdout)
	}
}

func cached(t *testing.T, state string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(filepath.Join(state, "cas", "objects"), func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAsyncQueueSurvivesSIGKILL: esfd with --remote-durability async
// acknowledges writes while the remote refuses every upload (a proxy
// answering 503); SIGKILL while its uploader retries; restarted with the
// remote reachable, the queue drains (esfctl status) and fsck --remote is
// clean.
func TestAsyncQueueSurvivesSIGKILL(t *testing.T) {
	requireFUSE(t)
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	proxy := s3test.StartProxy(t, srv)
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	url := strings.Replace(srv.URL(bucket, "q"), srv.Endpoint, proxy.Endpoint, 1)
	flags := []string{"--cas-remote", url, "--remote-durability", "async"}
	proxy.Set(func(r *http.Request) s3test.Fault {
		if r.Method == http.MethodPut {
			return s3test.Fault{Kind: s3test.Status, Status: 503}
		}
		return s3test.Fault{}
	})

	a := startDaemonWith(t, "", flags...)
	g := createGroup(t, a, smallTree(t, a, map[string]string{"a.txt": "a\n", "d/b.txt": "b\n"}))
	at := activate(t, a, g.Node.NodeID)
	writeFile(t, filepath.Join(at.Root, "d", "c.txt"), "sealed while uploads fail\n")
	s := suspend(t, a, at.AttemptID)
	st := remoteStatus(t, a)
	if st.Durability != "async" || st.QueueObjects == 0 {
		t.Fatalf("status after acknowledged writes with uploads refused: %+v", st)
	}
	waitUntil(t, "a failed upload", func() bool { return remoteStatus(t, a).QueueError != "" })
	a.cmd.Process.Kill()
	<-a.exited

	proxy.Set(nil)
	b := startDaemonWith(t, a.state, flags...)
	waitUntil(t, "the upload queue to drain", func() bool { return remoteStatus(t, b).QueueObjects == 0 })
	if r := b.mustCtl(nil, "fsck", "--remote"); strings.Contains(r.stdout, "missing") || strings.Contains(r.stdout, "corrupt") {
		t.Fatalf("fsck --remote after the queue drained: %s", r.stdout)
	}
	out := filepath.Join(t.TempDir(), "out")
	b.mustCtl(nil, "export", s.Node.NodeID, "--to", out)
	if got := readFile(t, filepath.Join(out, "d", "c.txt")); got != "sealed while uploads fail\n" {
		t.Fatalf("export after restart: %q", got)
	}
}

type remoteJSON struct {
	Durability   string `json:"durability"`
	QueueObjects int    `json:"queue_objects"`
	QueueError   string `json:"queue_error"`
}

func remoteStatus(t *testing.T, d *daemon) remoteJSON {
	t.Helper()
	var st struct {
		Remote *remoteJSON `json:"remote"`
	}
	decode(t, d.mustCtl(nil, "-o", "json", "status"), &st)
	if st.Remote == nil {
		t.Fatal("status shows no remote")
	}
	return *st.Remote
}

// ESF_E2E_CAS_REMOTE=1 runs every daemon of the suite with --cas-remote on
// one versitygw (the FR tests that involve content, through the verified
// cache): startSharedRemote starts it in TestMain, remoteFlags adds the
// flag to daemons whose test did not choose their own remote.
var sharedRemote struct {
	srv    *s3test.Server
	bucket string
}

func startSharedRemote() (stop func(), err error) {
	if os.Getenv("ESF_E2E_CAS_REMOTE") == "" {
		return nil, nil
	}
	srv, err := s3test.StartServer()
	if err != nil {
		return nil, err
	}
	bucket, err := srv.NewBucket(context.Background())
	if err != nil {
		srv.Stop()
		return nil, err
	}
	for _, kv := range append(srv.Env(), "AWS_EC2_METADATA_DISABLED=true") {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	sharedRemote.srv, sharedRemote.bucket = srv, bucket
	return srv.Stop, nil
}

// remoteFlags adds the shared server's --cas-remote with a prefix of the
// daemon's own (by state dir: a restarted daemon finds its content again),
// so tests stay as independent as with local stores.
func remoteFlags(state string, flags []string) []string {
	if sharedRemote.srv == nil || slices.Contains(flags, "--cas-remote") {
		return flags
	}
	prefix := cas.Sum([]byte(state)).Short()
	return append(slices.Clone(flags), "--cas-remote", sharedRemote.srv.URL(sharedRemote.bucket, prefix))
}
