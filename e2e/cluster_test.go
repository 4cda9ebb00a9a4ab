package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/esf-dev/esf/internal/s3test"
)

// TestFR04_FR05_TwoWorkersOnEtcdAndS3: the whole scale-out at once (the
// acceptance of issue 20). Two esfd workers share one graph on a real etcd
// and one content store on a real S3 server (versitygw, one bucket and
// prefix), each with its own local cache:
//   - a group created through worker A is forked through worker B;
//   - a node sealed on A is activated on B, whose cache holds nothing yet,
//     and reads the same bytes (B fetches them from the bucket); both
//     exports are identical;
//   - FR-04: 64 concurrent promotes spread over both workers, all with the
//     same expected generation: exactly one wins, the rest are refused
//     stale_generation (or conflict);
//   - FR-05: evaluate --backprop delivered six times under one idempotency
//     key, alternately and concurrently through both workers, is counted
//     once on the node and its ancestors; another request under the key is
//     a conflict on either worker.
func TestFR04_FR05_TwoWorkersOnEtcdAndS3(t *testing.T) {
	_, journalURL := startEtcd(t)
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	for _, kv := range append(srv.Env(), "AWS_EC2_METADATA_DISABLED=true") {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	casURL := srv.URL(bucket, "cluster")
	worker := func(id string) *daemon {
		flags := []string{"--journal", journalURL, "--worker", id}
		d := startDaemonWith(t, "", append(flags, "--worker-ttl", "5s", "--cas-remote", casURL)...)
		d.stopAllFlags = flags
		return d
	}
	a := worker("wa")
	b := worker("wb")
	eventually(t, "both workers listed", func() bool { return workers(t, b).ids() == "wa,wb" })

	files := map[string]string{"top.txt": "top\n", "big.bin": strings.Repeat("0123456789abcdef", 64<<10)}
	for _, d := range []string{"x", "y"} {
		for _, f := range []string{"1", "2", "3"} {
			files[d+"/"+f+".txt"] = strings.Repeat(d+f, 200)
		}
	}
	g := createGroup(t, a, smallTree(t, a, files))

	// Created on A, forked on B: B reads A's commit from etcd.
	kids := fork(t, b, g.Node.NodeID, 2)
	var tree struct {
		Nodes []nodeJSON `json:"nodes"`
	}
	decode(t, a.mustCtl(nil, "-o", "json", "tree", g.Group.GroupID), &tree)
	if len(tree.Nodes) != 3 {
		t.Fatalf("A sees %d nodes after B forked its group twice, want 3", len(tree.Nodes))
	}

	// Sealed on A, activated on B with a cache that holds none of it.
	at := activate(t, a, kids[0], "--worker", "wa")
	if !strings.HasPrefix(at.Root, filepath.Dir(a.state)) {
		t.Fatalf("the attempt pinned to A runs at %s, not under A's %s", at.Root, a.state)
	}
	writeFile(t, filepath.Join(at.Root, "y", "new.txt"), "written on A\n")
	writeFile(t, filepath.Join(at.Root, "top.txt"), "changed on A\n")
	sealed := suspend(t, a, at.AttemptID).Node.NodeID
	if n := cached(t, b.state); n != 0 {
		t.Fatalf("B's cache holds %d objects before B reads anything, want 0", n)
	}
	bt := activate(t, b, sealed, "--worker", "wb")
	if !strings.HasPrefix(bt.Root, filepath.Dir(b.state)) {
		t.Fatalf("the attempt pinned to B runs at %s, not under B's %s", bt.Root, b.state)
	}
	for path, want := range map[string]string{"y/new.txt": "written on A\n", "top.txt": "changed on A\n",
		"x/2.txt": files["x/2.txt"], "big.bin": files["big.bin"]} {
		if got := readFile(t, filepath.Join(bt.Root, path)); got != want {
			t.Fatalf("B reads %s: %d bytes %.40q, want %d bytes %.40q", path, len(got), got, len(want), want)
		}
	}
	if n := cached(t, b.state); n == 0 {
		t.Fatal("B read A's checkpoint without fetching anything into its cache")
	}
	b.mustCtl(nil, "release", bt.AttemptID)
	outA, outB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	a.mustCtl(nil, "export", sealed, "--to", outA)
	b.mustCtl(nil, "export", sealed, "--to", outB)
	compareTrees(t, outA, outB)

	// FR-04 over two workers: one compare-and-swap wins.
	gen := g.Group.Generation
	candidates := []string{g.Node.NodeID, sealed}
	var mu sync.Mutex
	var wins []string
	refused := map[string]int{}
	var wg sync.WaitGroup
	for i := range 64 {
		d := []*daemon{a, b}[i%2]
		node := candidates[(i/2)%2]
		wg.Go(func() {
			r := d.ctl(nil, "-o", "json", "promote", g.Group.GroupID, node, "--expected-generation", fmt.Sprint(gen))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.code == 0:
				wins = append(wins, node)
			case r.code == 5 && strings.Contains(r.stderr, `"stale_generation"`):
				refused["stale_generation"]++
			case r.code == 4 && strings.Contains(r.stderr, `"conflict"`):
				refused["conflict"]++
			default:
				t.Errorf("promote %s through %s: exit %d\n%s%s", node, d.state, r.code, r.stdout, r.stderr)
			}
		})
	}
	wg.Wait()
	if len(wins) != 1 || refused["stale_generation"]+refused["conflict"] != 63 {
		t.Fatalf("64 promotes over two workers: %d won, refused %v; want exactly one winner", len(wins), refused)
	}
	t.Logf("64 promotes over two workers: one won, refused %v", refused)
	var grp groupJSON
	decode(t, b.mustCtl(nil, "-o", "json", "inspect", g.Group.GroupID), &grp)
	if grp.Group.Generation != gen+1 || grp.Group.CanonicalNodeID != wins[0] {
		t.Fatalf("group after the race: %+v, want generation %d and canonical %s", grp.Group, gen+1, wins[0])
	}

	// FR-05 over two workers: one backprop, however delivered.
	eval := []string{"evaluate", sealed, "--evaluator", "e@1", "--reward", "2", "--verdict", "ok", "--backprop", "--idempotency-key", "cluster-eval-1"}
	a.mustCtl(nil, eval...)
	var replays sync.WaitGroup
	for i := range 6 {
		d := []*daemon{b, a}[i%2]
		replays.Go(func() {
			if r := d.ctl(nil, eval...); r.code != 0 {
				t.Errorf("replay through %s: exit %d: %s", d.state, r.code, r.stderr)
			}
		})
	}
	replays.Wait()
	for _, d := range []*daemon{a, b} {
		for _, id := range []string{sealed, kids[0], g.Node.NodeID} {
			if n, _ := inspectNode(t, d, id); n.Visits != 1 || n.Value != 2 {
				t.Fatalf("%s after 7 deliveries of one backprop, read through %s: visits %d value %v; want 1 and 2", id, d.state, n.Visits, n.Value)
			}
		}
		other := slices.Clone(eval)
		other[slices.Index(other, "2")] = "3" // the reward
		r := d.ctl(nil, append(other, "-o", "json")...)
		if r.code != 4 {
			t.Fatalf("another request under the key through %s: exit %d, want 4 (%s)", d.state, r.code, r.stderr)
		}
		jsonErr(t, r, "conflict")
	}
}
