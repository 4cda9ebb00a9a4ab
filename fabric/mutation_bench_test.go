package fabric

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/internal/testenv"
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

// BenchmarkSealOne is the bench's row "seal one 4 KiB change, root of 100
// files" as a Fabric method (issue 21, item 2), on the real overlay and
// FUSE projection: fork a node of a 100-file root, activate it (executor
// none), overwrite one file three directories deep, and time only the
// Suspend (release included). cpu-µs/op is the process's user and system
// time during the Suspends alone.
//
//	go test ./fabric -run '^$' -bench SealOne -cpuprofile seal.prof
func BenchmarkSealOne(b *testing.B) {
	testenv.Require(b, "root", "fuse", "overlay")
	f := openGraphWith(b, Options{StateDir: b.TempDir()})
	files := make(map[string]string, 100)
	for i := range 100 {
		files[fmt.Sprintf("p000/d00/f%02d.txt", i)] = fmt.Sprintf("file %d\n", i)
	}
	g := newGroup(b, f, files)
	ctx := context.Background()
	page := make([]byte, 4096)
	var cpu time.Duration
	b.ReportAllocs()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		kids, err := f.Fork(ctx, ForkRequest{NodeID: g.Node.NodeID, N: 1})
		if err != nil {
			b.Fatal(err)
		}
		a, err := f.Activate(ctx, ActivateRequest{NodeID: kids.Nodes[0].NodeID})
		if err != nil {
			b.Fatal(err)
		}
		binary.LittleEndian.PutUint64(page, uint64(i+1))
		if err := os.WriteFile(filepath.Join(a.Root, "p000/d00/f00.txt"), page, 0o644); err != nil {
			b.Fatal(err)
		}
		cpu0 := processCPU()
		b.StartTimer()
		_, err = f.Suspend(ctx, SuspendRequest{AttemptID: a.AttemptID})
		b.StopTimer()
		cpu += processCPU() - cpu0
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
}
