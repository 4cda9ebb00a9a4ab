package crashtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/journal"
)

// TestFR03_MutationsAreAtomicUnderCrashOnEtcd runs the crash matrix with
// esfd's journal on etcd: SIGKILL at every failpoint of each operation
// below, an audit of the journal as the crash left it, a restart, replays.
//
// A subset of the operations, to keep CI time in check (the full pebble
// matrix takes about two minutes): every operation reaches the journal
// through the same Store calls whatever the store, and journaltest holds
// the etcd store to the same contract, so what etcd can add is in the
// store's own paths: an Update's commit and its lost-reply handling, the
// event log a dead writer leaves pending, a large transaction published
// but not rolled forward, and recovery reading attempts from etcd. The
// subset covers each: group creation and a fork (one commit each, events),
// a fork of 60 children (staged: it also crashes between publishing and
// rolling forward), activation and release (several Updates, a lease,
// the mount recovered), and a seal (its full sequence of Updates).
func TestFR03_MutationsAreAtomicUnderCrashOnEtcd(t *testing.T) {
	requireRoot(t)
	requireEtcd(t)
	t.Parallel() // its cases share the -parallel slots with the other FR-03 tests'
	mode := etcdMode()
	start := time.Now()
	var m matrix
	t.Cleanup(func() {
		m.log(t, fmt.Sprintf("FR-03 matrix on etcd (%v; template %v; time in all cases so far: %v)", time.Since(start).Round(time.Second), buildTime(mode).Round(time.Millisecond), timing))
	})
	template(t, mode)
	for _, spec := range etcdSpecs() {
		t.Run(spec.name, func(t *testing.T) {
			t.Parallel()
			runSpec(t, mode, spec, &m)
		})
	}
}

func etcdSpecs() []*opSpec {
	// 60 children: 60 records, 120 index keys and 60 events, far beyond
	// etcd's 128 operations per request.
	staged := forkSpecN("fork-60", 60)
	staged.staged = true
	return []*opSpec{createGroupSpec(), forkSpec(), staged, activateSpec(), releaseSpec(), suspendSpec("suspend-child", false, false)}
}

// TestEtcdLeaderKilledUnderLoad SIGKILLs the leader of a 3-member etcd
// cluster while clients fork, activate, write and seal through esfd, then
// restarts it. Clients retry an operation that failed for want of the
// cluster with its idempotency key, as the API says. After the run the
// journal is audited (every record, index and event consistent: no
// ambiguous node), every acknowledged seal is there, sealed, and its
// export holds what the client wrote, and no attempt is left half-sealed.
func TestEtcdLeaderKilledUnderLoad(t *testing.T) {
	requireRoot(t)
	requireEtcd(t)
	dir := filepath.Join(workDir, "leader")
	cluster, err := etcdtest.StartCluster(etcdtest.Options{Members: 3, Dir: filepath.Join(dir, "etcd")})
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Stop()
	mode := &journalMode{name: "etcd-3", cluster: cluster}
	state, prefix := filepath.Join(dir, "state"), "leader"
	fixture := filepath.Join(dir, "fixture")
	if err := writeFixture(fixture); err != nil {
		t.Fatal(err)
	}
	// An election can keep esfd from renewing its worker lease for a second
	// or more, and a short lease then fences it, correctly, in the middle
	// of the run. This test is about the journal riding out the election,
	// so esfd gets a lease that outlives one, whatever the matrix's; the
	// last --worker-ttl given counts.
	d, err := startDaemon(state, filepath.Join(dir, "s.sock"), "", append(mode.args(prefix), "--worker-ttl", "15s"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.kill()
		if notes := teardown(dir, state, mode, prefix, true); len(notes) > 0 {
			t.Logf("cleanup: %s", strings.Join(notes, "; "))
		}
	}()

	// call retries a mutation under its key while the cluster cannot
	// answer (unavailable, or deadline_exceeded from a slow election).
	var retried atomic.Int64
	call := func(path, key string, body, out any) error {
		var last string
		for try := 0; try < 20; try++ {
			r, err := d.call(http.MethodPost, path, key, body)
			if err != nil {
				return fmt.Errorf("POST %s: no reply: %v", path, err)
			}
			switch r.errorCode() {
			case "":
				return json.Unmarshal(r.body, out)
			case "unavailable", "deadline_exceeded":
				retried.Add(1)
				last = r.String()
				time.Sleep(200 * time.Millisecond)
				continue
			}
			return fmt.Errorf("POST %s (key %s): %s", path, key, r)
		}
		return fmt.Errorf("POST %s (key %s): still failing: %s", path, key, last)
	}
	var imp struct {
		RootID string `json:"root_id"`
	}
	if err := call("/v1/import", "imp", map[string]string{"source": fixture}, &imp); err != nil {
		t.Fatal(err)
	}
	var g fabric.CreateGroupResult
	if err := call("/v1/groups", "grp", map[string]string{"root_id": imp.RootID}, &g); err != nil {
		t.Fatal(err)
	}

	type sealed struct{ node, file, content string }
	var mu sync.Mutex
	var acked []sealed
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				k := fmt.Sprintf("w%d-%d", w, i)
				var kids fabric.ForkResult
				var a fabric.AttemptView
				var res fabric.SuspendResult
				file, content := "seal-"+k+".txt", "sealed by "+k
				err := call("/v1/fork", k+"-fork", fabric.ForkRequest{NodeID: g.Node.NodeID, N: 1}, &kids)
				if err == nil {
					err = call("/v1/activate", k+"-activate", fabric.ActivateRequest{NodeID: kids.Nodes[0].NodeID}, &a)
				}
				if err == nil {
					err = os.WriteFile(filepath.Join(a.Root, file), []byte(content), 0o644)
				}
				if err == nil {
					err = call("/v1/suspend", k+"-suspend", fabric.SuspendRequest{AttemptID: a.AttemptID}, &res)
				}
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				acked = append(acked, sealed{res.Node.NodeID, file, content})
				mu.Unlock()
			}
		})
	}
	waitSeals := func(n int) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			mu.Lock()
			got := len(acked)
			mu.Unlock()
			select {
			case err := <-errc:
				t.Fatal(err)
			default:
			}
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d seals acknowledged, want %d\nesfd log:\n%s", got, n, tail(d.logs.String()))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitSeals(12)
	leader, err := cluster.Leader()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	cluster.Members[leader].Kill()
	t.Logf("killed etcd's leader %s after %d acknowledged seals", cluster.Members[leader].Name, before)
	waitSeals(before + 12)
	if err := cluster.Members[leader].Restart(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	after := len(acked)
	mu.Unlock()
	waitSeals(after + 8)
	cancel()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	t.Logf("%d seals acknowledged; %d replies retried under their key (unavailable)", len(acked), retried.Load())

	// Every acknowledged seal: its export has what the client wrote.
	for i, s := range acked {
		if i%5 != 0 { // a sample: each export is a tar of the fixture
			continue
		}
		r, err := d.call(http.MethodGet, "/v1/export/"+s.node+".tar", "", nil)
		if err != nil || r.status != http.StatusOK {
			t.Fatalf("export %s: %v %v", s.node, r, err)
		}
		if !bytes.Contains(r.body, []byte(s.content)) {
			t.Errorf("seal %s: its export lacks %s", s.node, s.file)
		}
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	snap, err := mode.read(state, prefix, "")
	if err != nil {
		t.Fatal(err)
	}
	if bad := snap.audit(); len(bad) > 0 {
		t.Errorf("journal inconsistent after the leader's death:\n  %s", strings.Join(bad, "\n  "))
	}
	for _, s := range acked {
		n, ok := snap.nodes[s.node]
		if !ok || n.Status != journal.NodeSealed {
			t.Errorf("acknowledged seal %s: %+v (present %v), want sealed", s.node, n, ok)
		}
	}
	for id, a := range snap.attempts {
		if a.State == journal.AttemptQuiescing {
			t.Errorf("attempt %s left quiescing", id)
		}
	}
}
