package api

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	fakeexec "github.com/esf-dev/esf/executor/fake"
	"github.com/esf-dev/esf/fabric"
	fakemounter "github.com/esf-dev/esf/mounter/fake"
)

// The CPU a graph mutation costs end to end (issue 21, item 1): a client
// sends it over the daemon's unix socket, the server decodes it, the Fabric
// commits it to pebble (fdatasync'd), the answer goes back. On a machine of
// two CPUs, 64 clients get at most 2 CPUs / this cost through; so the
// metric that matters is cpu-µs/op (the process's user and system time per
// operation: clients, server, Fabric and journal together) and allocs/op,
// not ns/op (one flush dominates that with one client).
//
//	go test ./api -run '^$' -bench 'Fork|EvaluateBackprop' -benchmem -cpuprofile cpu.out

// mutationDaemon is a Fabric (pebble journal, local store; fake mounter and
// executor: these mutations mount nothing) served on a unix socket, with a
// group whose root node the benchmark forks or evaluates.
func mutationDaemon(b *testing.B) (socket, root string) {
	b.Helper()
	dir := b.TempDir()
	log := slog.New(slog.DiscardHandler) // as the bench's daemon
	f, err := fabric.Open(context.Background(), fabric.Options{StateDir: filepath.Join(dir, "state"), Logger: log,
		Mounter: fakemounter.New(), Executor: fakeexec.New()})
	if err != nil {
		b.Fatal(err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("a\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	g, err := f.CreateGroupFrom(context.Background(), fabric.ImportSource{Path: src}, fabric.CreateGroupRequest{Source: src})
	if err != nil {
		b.Fatal(err)
	}
	socket = filepath.Join(dir, "esfd.sock")
	ln, err := Listen(socket)
	if err != nil {
		b.Fatal(err)
	}
	srv := NewServer(f, ServerOptions{Logger: log})
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln, 10*time.Second) }()
	b.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			b.Errorf("Serve: %v", err)
		}
		f.StopAll(context.Background())
		f.Close()
	})
	return socket, g.Node.NodeID
}

// processCPU is this process's user and system time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFork is `fork -n 1` of a group's root through the API.
func BenchmarkFork(b *testing.B) {
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			socket, root := mutationDaemon(b)
			benchMutation(b, socket, clients, func(ctx context.Context, c *client.Client) error {
				_, err := c.Fork(ctx, v1.ForkRequest{NodeID: root, N: 1}, client.CallOptions{})
				return err
			})
		})
	}
}

// BenchmarkEvaluateBackprop is `evaluate --backprop` of a group's root
// through the API.
func BenchmarkEvaluateBackprop(b *testing.B) {
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			socket, root := mutationDaemon(b)
			benchMutation(b, socket, clients, func(ctx context.Context, c *client.Client) error {
				_, err := c.Evaluate(ctx, v1.EvaluateRequest{Target: root, Evaluator: "bench@1", Reward: 0.5, Verdict: "ok", Backprop: true}, client.CallOptions{})
				return err
			})
		})
	}
}

// benchMutation runs op b.N times through `clients` clients at once (each
// its own connection, as separate processes would have) and reports the
// process's CPU time per op.
func benchMutation(b *testing.B, socket string, clients int, op func(context.Context, *client.Client) error) {
	b.Helper()
	cs := make([]*client.Client, clients)
	for i := range cs {
		cs[i] = client.NewClient(socket)
		b.Cleanup(func() { cs[i].Close() })
		if err := op(context.Background(), cs[i]); err != nil { // connect
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	var next atomic.Int64
	cpu0 := processCPU()
	b.ResetTimer()
	if clients == 1 {
		for range b.N {
			if err := op(context.Background(), cs[0]); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		// RunParallel starts parallelism × GOMAXPROCS goroutines; each
		// takes a client of its own (round robin if there are more).
		b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) {
			c := cs[int(next.Add(1)-1)%clients]
			for pb.Next() {
				if err := op(context.Background(), c); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}
