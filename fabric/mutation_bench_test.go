package fabric

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The CPU of a graph mutation as a Fabric method (issue 21, item 1): the
// journal's pebble on the real filesystem, fdatasync'd; fake mounter and
// executor, which these operations do not use. cpu-µs/op is the process's
// user and system time per operation (ns/op is one flush, mostly waiting);
// the API's benchmarks of the same names add the HTTP and JSON layers.
//
//	go test ./fabric -run '^$' -bench 'Fork|EvaluateBackprop' -benchmem

func benchFabric(b *testing.B, op func(ctx context.Context, f *Fabric, root string) error) {
	f := openLogic(b)
	g := newGroup(b, f, map[string]string{"a": "1"})
	ctx := context.Background()
	if err := op(ctx, f, g.Node.NodeID); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu0 := processCPU()
	for b.Loop() {
		if err := op(ctx, f, g.Node.NodeID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

func BenchmarkFork(b *testing.B) {
	benchFabric(b, func(ctx context.Context, f *Fabric, root string) error {
		_, err := f.Fork(ctx, ForkRequest{NodeID: root, N: 1})
		return err
	})
}

func BenchmarkEvaluateBackprop(b *testing.B) {
	benchFabric(b, func(ctx context.Context, f *Fabric, root string) error {
		_, err := f.Evaluate(ctx, EvaluateRequest{Target: root, Evaluator: "bench@1", Reward: 0.5, Verdict: "ok", Backprop: true})
		return err
	})
}

func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
