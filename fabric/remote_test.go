package fabric

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/esf-dev/esf/cas"
	s3store "github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/internal/s3test"
	"github.com/esf-dev/esf/internal/testenv"
	"github.com/esf-dev/esf/journal"
)

func remoteStore(t *testing.T, srv *s3test.Server, bucket string) *s3store.Store {
	t.Helper()
	c := awss3.New(srv.Client().Options(), s3store.ClientOptions)
	st, err := s3store.New(s3store.Options{Client: c, Bucket: bucket, Prefix: "esf", TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func openRemote(t *testing.T, dir string, remote *s3store.Store) *Fabric {
	t.Helper()
	return openRemoteWith(t, Options{StateDir: dir, Remote: remote})
}

func openRemoteWith(t *testing.T, o Options) *Fabric {
	t.Helper()
	f, err := Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
	})
	return f
}

// The restore path: a checkpoint sealed on daemon A (content in S3), then a
// daemon B with the same journal and an empty cache activates the node and
// reads one file, fetching only the trees on its path and that file's
// blob; B's export is byte-identical to A's.
func TestRemoteRestore(t *testing.T) {
	requireMounts(t)
	testenv.Require(t, "s3", "cmd:diff")
	ctx := context.Background()
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)

	dirA := t.TempDir()
	// A is closed by hand before B opens its journal (not by a cleanup).
	fa, err := Open(ctx, Options{StateDir: dirA, Remote: remoteStore(t, srv, bucket)})
	if err != nil {
		t.Fatal(err)
	}
	closedA := false
	t.Cleanup(func() {
		if !closedA {
			fa.StopAll(context.Background())
			fa.Close()
		}
	})
	files := map[string]string{"top.txt": "top"}
	for d := range 4 {
		for i := range 25 {
			files[fmt.Sprintf("d%d/f%02d.txt", d, i)] = fmt.Sprintf("content of %d/%d ", d, i) + string(bytes.Repeat([]byte{'a' + byte(d)}, i*100))
		}
	}
	files["d3/large.bin"] = string(bytes.Repeat([]byte("0123456789abcdef"), 100<<10)) // 1.6 MiB: loose
	g := newGroup(t, fa, files)
	a, err := fa.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.Root, "d1", "new.txt"), []byte("written in the attempt"), 0o644); err != nil {
		t.Fatal(err)
	}
	sealed, err := fa.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	outA := filepath.Join(t.TempDir(), "a")
	if _, _, err := fa.ExportDir(ctx, sealed.Node.NodeID, outA); err != nil {
		t.Fatal(err)
	}
	if err := fa.StopAll(ctx); err != nil {
		t.Fatal(err)
	}
	closedA = true
	if err := fa.Close(); err != nil {
		t.Fatal(err)
	}

	// B: A's journal, an empty cache.
	dirB := t.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join(dirA, "journal"), filepath.Join(dirB, "journal")).CombinedOutput(); err != nil {
		t.Fatalf("copy journal: %v: %s", err, out)
	}
	fb := openRemote(t, dirB, remoteStore(t, srv, bucket))
	if n := countObjects(t, filepath.Join(dirB, "cas")); n != 0 {
		t.Fatalf("B's cache starts with %d objects", n)
	}
	b, err := fb.Activate(ctx, ActivateRequest{NodeID: sealed.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(b.Root, "d2", "f07.txt"))
	if err != nil || string(got) != files["d2/f07.txt"] {
		t.Fatalf("read through B's activation: %q, %v", got, err)
	}
	// The root tree, d2's tree and the blob: nothing of d0, d1, d3.
	st := fb.tier.Stats()
	if n := st.Fetches.Load(); n > 3 {
		t.Fatalf("activate and one read fetched %d objects, want at most 3 (root tree, d2 tree, the blob)", n)
	}
	for _, p := range []string{"d0/f03.txt", "d3/large.bin", "d1/new.txt"} {
		if ok, _ := fb.local.Has(ctx, cas.Sum([]byte(files[p]+map[string]string{"d1/new.txt": "written in the attempt"}[p]))); ok {
			t.Fatalf("B fetched %s without reading it", p)
		}
	}
	t.Logf("activate + one read: %d fetches, %d bytes", st.Fetches.Load(), st.FetchedBytes.Load())
	if _, err := fb.Release(ctx, ReleaseRequest{AttemptID: b.AttemptID}); err != nil {
		t.Fatal(err)
	}
	outB := filepath.Join(t.TempDir(), "b")
	if _, _, err := fb.ExportDir(ctx, sealed.Node.NodeID, outB); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("diff", "-r", "--no-dereference", outA, outB).CombinedOutput(); err != nil {
		t.Fatalf("exports of A and B differ: %v\n%s", err, out)
	}
	if got, err := os.ReadFile(filepath.Join(outB, "d1", "new.txt")); err != nil || string(got) != "written in the attempt" {
		t.Fatalf("the attempt's file in B's export: %q, %v", got, err)
	}
	if n := fb.tier.Stats().Uploads.Load(); n != 0 {
		t.Fatalf("B uploaded %d objects while only reading", n)
	}
}

func countObjects(t *testing.T, casDir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(filepath.Join(casDir, "objects"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return n
}

// With the remote down, a seal fails unavailable (sync durability: it is
// never acknowledged without its content in the remote) and the attempt
// stays live; once the remote is back the same seal succeeds and its
// content is in the remote. The remote is real, the mounts fake: what is
// proven is the seal's durability, not overlayfs.
func TestRemoteDownSealUnavailable(t *testing.T) {
	testenv.Require(t, "s3")
	ctx := context.Background()
	srv := s3test.Start(t)
	remote := remoteStore(t, srv, srv.Bucket(t))
	f := openRemoteWith(t, logicOptions(Options{StateDir: t.TempDir(), Remote: remote}))
	g := newGroup(t, f, map[string]string{"a": "1"})
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	const content = "sealed while the remote was down"
	if err := os.WriteFile(filepath.Join(a.Root, "b"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if _, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("seal with the remote down: %v, want unavailable", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	res, err := f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
	if err != nil {
		t.Fatalf("seal once the remote is back: %v", err)
	}
	if res.Node.Status != journal.NodeSealed {
		t.Fatalf("node %s after the second seal", res.Node.Status)
	}
	if ok, err := remote.Has(ctx, cas.Sum([]byte(content))); !ok || err != nil {
		t.Fatalf("the sealed file is not in the remote: %v, %v", ok, err)
	}
}

// With a small --cache-size, what a live attempt reads stays cached while
// other writes evict; after the release it may go.
func TestRemoteCachePinsLiveAttempts(t *testing.T) {
	requireMounts(t)
	testenv.Require(t, "s3")
	ctx := context.Background()
	srv := s3test.Start(t)
	f, err := Open(ctx, Options{StateDir: t.TempDir(), Remote: remoteStore(t, srv, srv.Bucket(t)), CacheSize: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.StopAll(context.Background())
		f.Close()
	})
	files := map[string]string{}
	for i := range 8 {
		files[fmt.Sprintf("f%d", i)] = string(bytes.Repeat([]byte{'a' + byte(i)}, 2<<10))
	}
	g := newGroup(t, f, files)
	a, err := f.Activate(ctx, ActivateRequest{NodeID: g.Node.NodeID})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range files {
		if got, err := os.ReadFile(filepath.Join(a.Root, p)); err != nil || string(got) != want {
			t.Fatalf("read %s: %v", p, err)
		}
	}
	other := map[string]string{}
	for i := range 20 {
		other[fmt.Sprintf("o%d", i)] = string(bytes.Repeat([]byte{'A' + byte(i)}, 2<<10))
	}
	newGroup(t, f, other)
	if f.tier.Stats().Evictions.Load() == 0 {
		t.Fatal("nothing was evicted")
	}
	for p, c := range files {
		if ok, _ := f.local.Has(ctx, cas.Sum([]byte(c))); !ok {
			t.Fatalf("%s of a live attempt left the cache", p)
		}
	}
	if _, err := f.Release(ctx, ReleaseRequest{AttemptID: a.AttemptID}); err != nil {
		t.Fatal(err)
	}
	if err := f.tier.Evict(ctx); err != nil {
		t.Fatal(err)
	}
	if used := f.tier.CacheUsed(); used > 8<<10 {
		t.Fatalf("after the release the cache holds %d bytes, bound %d", used, 8<<10)
	}
}

// fsck --remote: clean after seals; an object deleted from the bucket is
// missing, one damaged there is bad; without a remote it is refused.
func TestRemoteFsck(t *testing.T) {
	testenv.Require(t, "s3")
	ctx := context.Background()
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	remote := remoteStore(t, srv, bucket)
	f, err := Open(ctx, Options{StateDir: t.TempDir(), Remote: remote})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	large := string(bytes.Repeat([]byte("L"), 400<<10)) // loose in the bucket
	newGroup(t, f, map[string]string{"a": "1", "b": "2", "large": large})
	res, err := f.FsckRemote(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Bad) != 0 || len(res.Missing) != 0 || res.Checked != 4 {
		t.Fatalf("fsck --remote of a whole remote: %+v, want 4 checked (root tree, 3 blobs)", res)
	}
	if err := remote.Delete(ctx, cas.Sum([]byte("2"))); err != nil {
		t.Fatal(err)
	}
	p := srv.Path(bucket, remote.Prefix()+"o/"+cas.Sum([]byte(large)).String())
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = f.FsckRemote(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Missing) != 1 || res.Missing[0] != cas.Sum([]byte("2")) {
		t.Fatalf("missing = %v, want the deleted blob", res.Missing)
	}
	if len(res.Bad) != 1 || res.Bad[0] != cas.Sum([]byte(large)) {
		t.Fatalf("bad = %v, want the damaged blob", res.Bad)
	}

	plain := openTest(t, t.TempDir())
	if _, err := plain.FsckRemote(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fsck --remote without a remote: %v", err)
	}
}

// gc --remote: unreachable objects leave the bucket once older than the
// grace period, reachable ones stay (fsck --remote clean), and content
// written again after its collection is uploaded again (the cache forgot
// it was remote).
func TestRemoteCollect(t *testing.T) {
	testenv.Require(t, "s3")
	ctx := context.Background()
	srv := s3test.Start(t)
	remote := remoteStore(t, srv, srv.Bucket(t))
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	f, err := Open(ctx, Options{StateDir: t.TempDir(), Remote: remote, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	newGroup(t, f, map[string]string{"keep": "kept content", "big": string(bytes.Repeat([]byte("K"), 300<<10))})
	src := t.TempDir()
	garbage := string(bytes.Repeat([]byte("G"), 300<<10))
	os.WriteFile(filepath.Join(src, "g1"), []byte(garbage), 0o644)
	os.WriteFile(filepath.Join(src, "g2"), []byte("small garbage"), 0o644)
	if _, err := f.Import(ctx, ImportSource{Path: src}); err != nil {
		t.Fatal(err)
	}
	rep, err := f.Collect(ctx, CollectRequest{Remote: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Deleted != 0 || rep.Remote == nil || rep.Remote.KeptYoung == 0 {
		t.Fatalf("gc --remote within the grace period: %+v", rep)
	}
	offset.Store(int64(2 * time.Hour))
	rep, err = f.Collect(ctx, CollectRequest{Remote: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Deleted != 3 { // g1, g2 and the garbage root tree
		t.Fatalf("gc --remote: %+v (remote %+v), want 3 deleted", rep, *rep.Remote)
	}
	if ok, _ := remote.Has(ctx, cas.Sum([]byte(garbage))); ok {
		t.Fatal("the garbage blob is still in the bucket")
	}
	fr, err := f.FsckRemote(ctx)
	if err != nil || len(fr.Missing) != 0 || len(fr.Bad) != 0 {
		t.Fatalf("fsck --remote after gc --remote: %+v, %v", fr, err)
	}
	// The cache still holds the garbage; importing it again must upload it.
	if _, err := f.Import(ctx, ImportSource{Path: src}); err != nil {
		t.Fatal(err)
	}
	if ok, err := remote.Has(ctx, cas.Sum([]byte(garbage))); !ok || err != nil {
		t.Fatalf("content imported again after its remote collection is not in the bucket: %v", err)
	}
}

// With a small --cache-size, what a read-only mount shows stays cached
// while other writes evict (found in mountinfo); after the unmount it may
// go.
func TestRemoteCachePinsReadOnlyMounts(t *testing.T) {
	requireMounts(t)
	testenv.Require(t, "s3")
	ctx := context.Background()
	srv := s3test.Start(t)
	f, err := Open(ctx, Options{StateDir: t.TempDir(), Remote: remoteStore(t, srv, srv.Bucket(t)), CacheSize: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.StopAll(context.Background())
		f.Close()
	})
	files := map[string]string{}
	for i := range 8 {
		files[fmt.Sprintf("f%d", i)] = string(bytes.Repeat([]byte{'a' + byte(i)}, 2<<10))
	}
	g := newGroup(t, f, files)
	dir := t.TempDir()
	if _, err := f.Mount(ctx, MountRequest{NodeID: g.Node.NodeID, Dir: dir}); err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			f.Umount(context.Background(), UmountRequest{Dir: dir})
		}
	})
	for p, want := range files {
		if got, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(got) != want {
			t.Fatalf("read %s: %v", p, err)
		}
	}
	other := map[string]string{}
	for i := range 20 {
		other[fmt.Sprintf("o%d", i)] = string(bytes.Repeat([]byte{'A' + byte(i)}, 2<<10))
	}
	newGroup(t, f, other)
	if f.tier.Stats().Evictions.Load() == 0 {
		t.Fatal("nothing was evicted")
	}
	for p, c := range files {
		if ok, _ := f.local.Has(ctx, cas.Sum([]byte(c))); !ok {
			t.Fatalf("%s of a read-only mount left the cache", p)
		}
	}
	if _, err := f.Umount(ctx, UmountRequest{Dir: dir}); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if err := f.tier.Evict(ctx); err != nil {
		t.Fatal(err)
	}
	if used := f.tier.CacheUsed(); used > 8<<10 {
		t.Fatalf("after the unmount the cache holds %d bytes, bound %d", used, 8<<10)
	}
}
