package pebble_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/failpoint"
	jpebble "github.com/esf-dev/esf/journal/pebble"
)

var seedFlag = flag.Uint64("seed", 0, "seed for the randomized crash test (0: pick one)")

const (
	crashGroup = "grp_crash"
	crashRoot  = "node_root"
)

var crashRootID = strings.Repeat("0f", 32)

func crashNodeID(i int) string { return fmt.Sprintf("node_%05d", i) }

type forkRequest struct {
	Parent string `json:"parent"`
	Child  string `json:"child"`
}

// seedCrashGroup creates the group every crash workload forks from.
func seedCrashGroup(t testing.TB, s journal.Store) {
	t.Helper()
	err := s.Update(context.Background(), func(tx journal.Tx) error {
		if err := journal.CreateGroup(tx, journal.Group{GroupID: crashGroup, RootNodeID: crashRoot, CanonicalNodeID: crashRoot, Generation: 1}); err != nil {
			return err
		}
		return journal.CreateNode(tx, journal.Node{NodeID: crashRoot, GroupID: crashGroup, RootID: crashRootID, Status: journal.NodeSealed, Provenance: journal.Provenance{Op: "create_group"}})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// forkOnce is the workload's unit: an idempotent fork that writes a node,
// two index keys, a counter, an event and an idempotency entry in one
// Update. Every crash check below asks whether these are all or nothing.
func forkOnce(ctx context.Context, s journal.Store, i int) ([]byte, bool, error) {
	req := forkRequest{Parent: crashRoot, Child: crashNodeID(i)}
	return journal.DoIdempotent(ctx, s, fmt.Sprintf("fork-%d", i), "fork", req, func(tx journal.Tx) (any, error) {
		n := journal.Node{NodeID: req.Child, GroupID: crashGroup, Parents: []string{crashRoot}, RootID: crashRootID,
			Status: journal.NodeDraft, Provenance: journal.Provenance{Op: "fork"}}
		if err := journal.CreateNode(tx, n); err != nil {
			return nil, err
		}
		if _, err := journal.Increment(tx, "forks"); err != nil {
			return nil, err
		}
		if err := tx.AppendEvent(n.Event(journal.EventNodeForked)); err != nil {
			return nil, err
		}
		return forkResult(i), nil
	})
}

// forkResult is fork i's recorded result. Every third one carries 24 KiB
// of padding, which the store keeps in a blob file once flushed: the crash
// checks cover separated values too.
func forkResult(i int) map[string]string {
	res := map[string]string{"node_id": crashNodeID(i)}
	if i%3 == 0 {
		res["pad"] = strings.Repeat(fmt.Sprintf("%05d", i), 24<<10/5)
	}
	return res
}

// wantResult is forkResult(i) as recorded.
func wantResult(t *testing.T, i int) string {
	t.Helper()
	b, err := json.Marshal(forkResult(i))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkForks verifies, on a store reopened after a crash, that the forks
// present are exactly 0..k-1 for some k >= minCommitted, each complete, and
// none partially present; it returns k.
func checkForks(t *testing.T, s journal.Store, attempted, minCommitted int) int {
	t.Helper()
	k := -1
	err := s.View(context.Background(), func(r journal.Reader) error {
		kids, err := journal.ChildrenOf(r, crashRoot)
		if err != nil {
			return err
		}
		forks, err := journal.Counter(r, "forks")
		if err != nil {
			return err
		}
		seq, err := r.LastSeq()
		if err != nil {
			return err
		}
		for i := 0; i < attempted; i++ {
			id := crashNodeID(i)
			_, nodeErr := journal.GetNode(r, id)
			res, idemFound, idemErr := journal.CheckIdempotency(r, fmt.Sprintf("fork-%d", i), "fork", forkRequest{Parent: crashRoot, Child: id})
			if idemErr != nil {
				return idemErr
			}
			if idemFound && string(res) != wantResult(t, i) {
				return fmt.Errorf("fork %d: recorded result %.100s is not what was written", i, res)
			}
			present := nodeErr == nil
			if !present && !errors.Is(nodeErr, journal.ErrNotFound) {
				return nodeErr
			}
			if present != idemFound {
				return fmt.Errorf("fork %d torn: node present %v, idempotency entry present %v", i, present, idemFound)
			}
			if present && k >= 0 {
				return fmt.Errorf("fork %d present after fork %d is missing: commits are not a prefix", i, k)
			}
			if !present && k < 0 {
				k = i
			}
		}
		if k < 0 {
			k = attempted
		}
		// Index keys, counter and event log must agree with the records.
		if len(kids) != k || int(forks) != k || int(seq) != k {
			return fmt.Errorf("%d forks present, but %d child index keys, counter %d, last event %d", k, len(kids), forks, seq)
		}
		var members int
		if err := journal.NodesOfGroup(r, crashGroup, func(string) error { members++; return nil }); err != nil {
			return err
		}
		if members != k+1 {
			return fmt.Errorf("%d forks present, group index lists %d nodes", k, members)
		}
		return r.Events(0, func(ev journal.Event) error {
			if want := crashNodeID(int(ev.Seq) - 1); ev.NodeID != want {
				return fmt.Errorf("event %d is for %s, want %s", ev.Seq, ev.NodeID, want)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if k < minCommitted {
		t.Fatalf("only %d forks survived, but %d Updates had returned before the crash", k, minCommitted)
	}
	return k
}

// openFS opens the store on fs with the smallest memtable, so that the
// workloads flush (and write blob files) as they go.
func openFS(t *testing.T, fs vfs.FS) *jpebble.Store {
	t.Helper()
	s, err := jpebble.Open("db", jpebble.Options{FS: fs, MemTableSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCrashAfterEachCommit crashes (keeping only synced data) after every
// Update: each returned Update must survive, complete.
func TestCrashAfterEachCommit(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openFS(t, fs)
	defer s.Close()
	seedCrashGroup(t, s)
	const n = 12
	for i := 0; i < n; i++ {
		if _, _, err := forkOnce(context.Background(), s, i); err != nil {
			t.Fatal(err)
		}
		crashed := fs.CrashClone(vfs.CrashCloneCfg{})
		re := openFS(t, crashed)
		if k := checkForks(t, re, n, i+1); k != i+1 {
			t.Fatalf("after %d commits and a crash, %d forks present", i+1, k)
		}
		// The replay of the last committed key returns its result.
		res, replayed, err := forkOnce(context.Background(), re, i)
		if err != nil || !replayed || string(res) != wantResult(t, i) {
			t.Fatalf("replay of fork %d after the crash: %.100s, replayed %v, %v", i, res, replayed, err)
		}
		if err := re.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCrashDuringCommits takes crash clones, keeping a random share of the
// unsynced data, while a writer commits: every clone must hold a prefix of
// whole Updates that includes all that had returned.
func TestCrashDuringCommits(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -seed %d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed>>1))

	fs := vfs.NewCrashableMem()
	s := openFS(t, fs)
	defer s.Close()
	seedCrashGroup(t, s)

	const n = 150
	var acked atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var writeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n && ctx.Err() == nil; i++ {
			if _, _, err := forkOnce(ctx, s, i); err != nil {
				if ctx.Err() == nil {
					writeErr = err
				}
				return
			}
			acked.Store(int64(i + 1))
		}
	}()
	var clones []*vfs.MemFS
	var mins []int
	for len(clones) < 12 {
		min := int(acked.Load())
		clones = append(clones, fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng}))
		mins = append(mins, min)
		if min == n {
			break
		}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
	cancel()
	wg.Wait()
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	for i, c := range clones {
		re := openFS(t, c)
		k := checkForks(t, re, n, mins[i])
		t.Logf("clone %d: %d acknowledged, %d present", i, mins[i], k)
		if err := re.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// crashChildEnv names the store directory of the SIGKILL helper process.
const crashChildEnv = "ESF_JOURNAL_CRASH_CHILD_DIR"

// TestCrashChild is the helper process of TestFailpointCrashKillsAndRecovers:
// it forks until a failpoint armed through ESF_FAILPOINTS kills it.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashChildEnv)
	if dir == "" {
		t.Skip("helper process for TestFailpointCrashKillsAndRecovers")
	}
	s, err := jpebble.Open(dir, jpebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	seedCrashGroup(t, s)
	for i := 0; i < 10; i++ {
		if _, _, err := forkOnce(context.Background(), s, i); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("no failpoint killed the helper")
}

// TestFailpointCrashKillsAndRecovers runs a real process against a real
// directory, kills it with SIGKILL at each journal failpoint through
// ESF_FAILPOINTS, reopens the store and checks that exactly the Updates
// committed before the kill are present, whole, and replay.
func TestFailpointCrashKillsAndRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	tests := []struct {
		point     string
		committed int // forks present after the 3rd evaluation kills the child
	}{
		{journal.FailpointUpdateBegin, 2},
		{journal.FailpointUpdateBeforeCommit, 2},
		{journal.FailpointUpdateAfterCommit, 3},
	}
	if names := strings.Join(failpoint.Names(), " "); !strings.Contains(names, journal.FailpointUpdateAfterCommit) {
		t.Fatalf("journal failpoints not declared: %s", names)
	}
	for _, tc := range tests {
		t.Run(tc.point, func(t *testing.T) {
			dir := t.TempDir()
			// The group seed is the 1st Update, so @4 hits the 3rd fork.
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, failpoint.EnvVar+"="+tc.point+"=crash@4")
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("helper did not die: %v\n%s", err, out)
			}
			if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("helper ended with %v, want SIGKILL\n%s", err, out)
			}
			s, err := jpebble.Open(dir, jpebble.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if k := checkForks(t, s, 10, tc.committed); k != tc.committed {
				t.Fatalf("%d forks present after a kill at %s, want %d", k, tc.point, tc.committed)
			}
			last := tc.committed - 1
			res, replayed, err := forkOnce(context.Background(), s, last)
			if err != nil || !replayed || string(res) != wantResult(t, last) {
				t.Fatalf("replay of the last committed fork: %.100s, replayed %v, %v", res, replayed, err)
			}
			if _, replayed, err := forkOnce(context.Background(), s, tc.committed); err != nil || replayed {
				t.Fatalf("the killed fork runs afresh: replayed %v, %v", replayed, err)
			}
			var got map[string]string
			if err := json.Unmarshal(res, &got); err != nil {
				t.Fatal(err)
			}
		})
	}
}
