package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/fabric"
)

// Throughput under concurrency (issue 21, target 1): graph mutations per
// second with many clients against one client, on the same daemon, in the
// same run. Each mutation is a durable journal commit; with group commit,
// concurrent commits share one WAL flush.

func init() {
	Register(Scenario{Name: "concurrency", Order: 31, Run: benchConcurrency})
}

// concurrentClients is the many-clients side of the rows: an RL
// coordinator or an MCTS controller driving many workers at once.
const concurrentClients = 64

func benchConcurrency(ctx context.Context, e *Env) error {
	dir, err := e.Tree(ctx, 10)
	if err != nil {
		return err
	}
	g, err := e.Group(ctx, dir)
	if err != nil {
		return err
	}
	d, err := e.Main(ctx)
	if err != nil {
		return err
	}
	root := g.Node.NodeID
	// One client.Client per client, each with its own connection, as separate
	// processes would have; with -bench.fabric they call the Fabric.
	clients := make([]*Ops, concurrentClients)
	for i := range clients {
		clients[i] = d.NewOps()
	}
	fork := func(ctx context.Context, o *Ops) error { _, err := o.Fork(ctx, root, 1); return err }
	evaluate := func(ctx context.Context, o *Ops) error {
		req := fabric.EvaluateRequest{Target: root, Evaluator: "bench@1", Reward: 0.5, Verdict: "ok", Backprop: true}
		if o.viaFabric {
			_, err := o.f.Evaluate(ctx, req)
			return err
		}
		_, err := o.c.Evaluate(ctx, v1.EvaluateRequest(req), apiOpts)
		return err
	}
	// ops mutations per measurement, spread over n clients.
	ops := e.Size(256, 640)
	// cpu[k] collects, per measurement of subject k, the CPU time this
	// process (clients and daemon) spent: what bounds the rows on a
	// machine whose cores are shared (see the part: rows).
	// wait[k], the time its threads spent runnable but waiting for a CPU.
	cpu, wait := make([][]time.Duration, 4), make([][]time.Duration, 4)
	run := func(k, n int, op func(context.Context, *Ops) error) Subject {
		return func(ctx context.Context) (Measurement, error) {
			cpu0, wait0 := processCPU(), runQueueWait()
			defer func() {
				cpu[k] = append(cpu[k], processCPU()-cpu0)
				wait[k] = append(wait[k], runQueueWait()-wait0)
			}()
			return Timed(float64(ops), func() error {
				var wg sync.WaitGroup
				errs := make([]error, n)
				for c := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := c; i < ops && errs[c] == nil; i += n {
							errs[c] = op(ctx, clients[c])
						}
					}()
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	subjects := []Subject{
		run(0, 1, fork), run(1, concurrentClients, fork),
		run(2, 1, evaluate), run(3, concurrentClients, evaluate),
	}
	// Warm up (connections of all the clients), then measure.
	if _, err := Interleave(ctx, 1, subjects...); err != nil {
		return err
	}
	for k := range cpu {
		cpu[k], wait[k] = cpu[k][:0], wait[k][:0]
	}
	start := time.Now()
	ms, err := Interleave(ctx, e.Size(3, 5), subjects...)
	if err != nil {
		return err
	}
	e.Logf("  concurrency rows measured in %v", time.Since(start).Round(time.Millisecond))
	path := d.Ops.Path("fork")
	for i, name := range []string{"forks", "evaluations with backprop"} {
		one, many := Rates(ms[2*i], 1), Rates(ms[2*i+1], 1)
		what := "fork -n 1 of a group's root"
		if i == 1 {
			what = "evaluate --backprop of a group's root"
		}
		e.Add(Row{Name: fmt.Sprintf("%s/s, 1 client", name), Value: one.P50, Unit: "ops/s", P90: one.P90, N: one.N, Samples: one.Values, Path: path,
			Note: fmt.Sprintf("%s, %d in a row by one client", what, ops)})
		e.Add(Row{Name: fmt.Sprintf("%s/s, %d concurrent clients", name, concurrentClients), Value: many.P50, Unit: "ops/s", P90: many.P90, N: many.N, Samples: many.Values,
			Baseline: name + "/s, 1 client", BaselineValue: one.P50, Targets: []Target{RatioAtLeast(8)}, Path: path,
			Note: fmt.Sprintf("%s, %d in all by %d clients (one connection each) at once; every one a durable journal commit", what, ops, concurrentClients)})
	}
	// What bounds the ratio on a shared machine: once 64 clients share
	// flushes, the rate is the CPU the process gets divided by the CPU one
	// operation costs (client and daemon are both in this process, as
	// esfctl and esfd share the machine's cores). CPUs wanted and not got
	// (runnable threads waiting for one) say whether more cores would have
	// raised it.
	for i, name := range []string{"fork", "evaluation with backprop"} {
		one, many := cpuPerOp(cpu[2*i], ops), cpuPerOp(cpu[2*i+1], ops)
		got, waited := perElapsed(cpu[2*i+1], ms[2*i+1]), perElapsed(wait[2*i+1], ms[2*i+1])
		e.Add(Row{Name: fmt.Sprintf("part: CPU time per %s, %d clients", name, concurrentClients), Value: many.P50, Unit: "ms", P90: many.P90, N: many.N, Samples: many.Values,
			Baseline: "1 client", BaselineValue: one.P50, Path: path,
			Note: "user + system CPU time of this process (clients, API server, Fabric, journal) per operation"})
		e.Add(Row{Name: fmt.Sprintf("part: CPUs this process got, %d clients (%s)", concurrentClients, name), Value: got.P50, Unit: "CPUs", P90: got.P90, N: got.N, Samples: got.Values, Path: path,
			Note: fmt.Sprintf("its CPU time over the elapsed time: %d clients do this / CPU time per operation", concurrentClients)})
		e.Add(Row{Name: fmt.Sprintf("part: CPUs this process waited for, %d clients (%s)", concurrentClients, name), Value: waited.P50, Unit: "CPUs", P90: waited.P90, N: waited.N, Samples: waited.Values, Path: path,
			Note: "time its threads were runnable but waiting for a CPU (schedstat run delay) over the elapsed time: above 0.5 or so, other tenants' load, not a lock, bounds the rate"})
	}
	return nil
}

// processCPU is the user + system CPU time this process has used.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runQueueWait is the time this process's threads have spent runnable
// but waiting for a CPU (the run delay of /proc/self/task/*/schedstat).
func runQueueWait() time.Duration {
	tasks, _ := filepath.Glob("/proc/self/task/*/schedstat")
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		var run, wait int64
		if _, err := fmt.Sscan(string(b), &run, &wait); err == nil {
			sum += time.Duration(wait)
		}
	}
	return sum
}

// cpuPerOp summarizes CPU times of measurements of ops operations each, in
// milliseconds per operation.
func cpuPerOp(cpu []time.Duration, ops int) Sample {
	xs := make([]float64, len(cpu))
	for i, c := range cpu {
		xs[i] = float64(c) / float64(time.Millisecond) / float64(ops)
	}
	return Summarize(xs)
}

// perElapsed summarizes a time per measurement over its elapsed time
// (CPU time over elapsed time: CPUs).
func perElapsed(ts []time.Duration, ms []Measurement) Sample {
	xs := make([]float64, 0, len(ts))
	for i, c := range ts {
		if i < len(ms) && ms[i].Elapsed > 0 {
			xs = append(xs, float64(c)/float64(ms[i].Elapsed))
		}
	}
	return Summarize(xs)
}
