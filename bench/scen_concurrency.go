package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/esf-dev/esf/api/client"
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
		clients[i] = &Ops{c: client.NewClient(d.Socket), f: d.Fabric, viaFabric: d.Ops.viaFabric}
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
	run := func(n int, op func(context.Context, *Ops) error) Subject {
		return func(ctx context.Context) (Measurement, error) {
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
		run(1, fork), run(concurrentClients, fork),
		run(1, evaluate), run(concurrentClients, evaluate),
	}
	// Warm up (connections of all the clients), then measure.
	if _, err := Interleave(ctx, 1, subjects...); err != nil {
		return err
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
	return nil
}
