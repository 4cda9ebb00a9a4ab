package pebble_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/journal"
	jpebble "github.com/esf-dev/esf/journal/pebble"
)

// benchGraph opens a store on the real filesystem holding a group of n
// sealed nodes in a tree of fan-out 10, node i a child of node (i-1)/10.
func benchGraph(b *testing.B, n int) *jpebble.Store {
	b.Helper()
	s, err := jpebble.Open(b.TempDir(), jpebble.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	const batch = 5000
	for lo := 0; lo < n; lo += batch {
		err := s.Update(context.Background(), func(tx journal.Tx) error {
			for i := lo; i < min(lo+batch, n); i++ {
				if i == 0 {
					if err := journal.CreateGroup(tx, journal.Group{GroupID: "grp_bench", RootNodeID: benchID(0), CanonicalNodeID: benchID(0), Generation: 1}); err != nil {
						return err
					}
				}
				node := journal.Node{NodeID: benchID(i), GroupID: "grp_bench", RootID: crashRootID, Status: journal.NodeSealed,
					LogicalState: []byte(`{"step":1,"note":"a small logical state"}`), Provenance: journal.Provenance{Op: "fork"}}
				if i > 0 {
					node.Parents = []string{benchID((i - 1) / 10)}
				}
				if err := journal.CreateNode(tx, node); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	// Let the flushes and compactions the bulk load started finish (three
	// quiet checks in a row, at most a minute), so the numbers are of a
	// graph at rest, as a daemon's is after it was built over time.
	quiet := 0
	for deadline := time.Now().Add(time.Minute); quiet < 3 && time.Now().Before(deadline); {
		m, err := s.Metrics()
		if err != nil {
			b.Fatal(err)
		}
		if m.Compact.NumInProgress == 0 && m.Flush.NumInProgress == 0 {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	return s
}

func benchID(i int) string { return fmt.Sprintf("node_%08d", i) }

// reportP50 records the median of the per-op durations.
func reportP50(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds()), "p99-µs")
}

// benchSizes are the graph sizes; ESF_BENCH_NODES adds a larger one (the
// 1M-node case of the acceptance takes minutes to build).
func benchSizes() []int {
	sizes := []int{1000, 20000}
	if v, err := strconv.Atoi(os.Getenv("ESF_BENCH_NODES")); err == nil && v > 0 {
		sizes = append(sizes, v)
	}
	return sizes
}

// BenchmarkFork measures a fork as fabric will run it: one idempotent Update
// that reads the parent, creates a draft child with its index keys, appends
// an event and records the result, fsync'd.
func BenchmarkFork(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			s := benchGraph(b, n)
			rng := rand.New(rand.NewPCG(1, 2))
			durs := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				parent := benchID(rng.IntN(n))
				child := fmt.Sprintf("node_f%08d", i)
				start := time.Now()
				_, _, err := journal.DoIdempotent(context.Background(), s, "fork-"+child, "fork", [2]string{parent, child}, func(tx journal.Tx) (any, error) {
					p, err := journal.GetNode(tx, parent)
					if err != nil {
						return nil, err
					}
					c := journal.Node{NodeID: child, GroupID: p.GroupID, Parents: []string{parent}, RootID: p.RootID, Status: journal.NodeDraft, Provenance: journal.Provenance{Op: "fork"}}
					if err := journal.CreateNode(tx, c); err != nil {
						return nil, err
					}
					if err := tx.AppendEvent(c.Event(journal.EventNodeForked)); err != nil {
						return nil, err
					}
					return c, nil
				})
				durs = append(durs, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
			}
			reportP50(b, durs)
		})
	}
}

// BenchmarkInspect measures reading what inspect shows of a node: the
// record, its children, attempts, leases, evaluations and its ancestry.
func BenchmarkInspect(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			s := benchGraph(b, n)
			rng := rand.New(rand.NewPCG(3, 4))
			durs := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := benchID(rng.IntN(n))
				start := time.Now()
				err := s.View(context.Background(), func(r journal.Reader) error {
					if _, err := journal.GetNode(r, id); err != nil {
						return err
					}
					for _, list := range []func(journal.Reader, string) ([]string, error){
						journal.ChildrenOf, journal.AttemptsOfNode, journal.LeasesOfNode, journal.EvaluationsOfNode,
					} {
						if _, err := list(r, id); err != nil {
							return err
						}
					}
					return journal.Ancestors(r, id, func(journal.Node) error { return nil })
				})
				durs = append(durs, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
			}
			reportP50(b, durs)
		})
	}
}

// BenchmarkForkConcurrent is BenchmarkFork by 64 goroutines at once: with
// group commit their WAL syncs are shared, so ns/op falls well below one
// fdatasync.
func BenchmarkForkConcurrent(b *testing.B) {
	s := benchGraph(b, 1000)
	var next atomic.Int64
	b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			parent, child := benchID(int(i%1000)), fmt.Sprintf("node_c%08d", i)
			_, _, err := journal.DoIdempotent(context.Background(), s, "fork-"+child, "fork", [2]string{parent, child}, func(tx journal.Tx) (any, error) {
				p, err := journal.GetNode(tx, parent)
				if err != nil {
					return nil, err
				}
				c := journal.Node{NodeID: child, GroupID: p.GroupID, Parents: []string{parent}, RootID: p.RootID, Status: journal.NodeDraft, Provenance: journal.Provenance{Op: "fork"}}
				if err := journal.CreateNode(tx, c); err != nil {
					return nil, err
				}
				return c, tx.AppendEvent(c.Event(journal.EventNodeForked))
			})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}
