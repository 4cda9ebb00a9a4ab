package bench_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"time"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/api/client"
	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/internal/testenv"
	journaletcd "github.com/esf-dev/esf/journal/etcd"
)

// Workers on one graph (issue 20): two daemons registered as workers of a
// 3-member etcd journal (fsync on, loopback). Forks per second with 64
// concurrent clients spread over both workers, against the same 64 clients
// on one of them; and an exec in a runc attempt of worker A called through
// worker B, which forwards it (HTTP on loopback), against the same exec
// called on A directly.

func init() {
	bench.Register(bench.Scenario{Name: "workers", Order: 91, Run: benchWorkers})
}

func benchWorkers(ctx context.Context, e *bench.Env) error {
	if err := testenv.Check("etcd"); err != nil {
		e.TODO("workers on etcd", fmt.Sprintf("%v (make bench sets it)", err))
		return nil
	}
	dir, err := e.Mkdir("workers")
	if err != nil {
		return err
	}
	cluster, err := etcdtest.StartCluster(etcdtest.Options{Members: 3, Dir: filepath.Join(dir, "etcd")})
	if err != nil {
		return err
	}
	e.Cleanup(func() error { cluster.Stop(); return nil })
	rootfs := filepath.Join(dir, "rootfs")
	if err := busyboxRootfs(rootfs); err != nil {
		return err
	}
	var ex *runc.Executor
	if runctest.Check() == nil {
		initPath, err := sharedInit()
		if err != nil {
			return err
		}
		if ex, err = runc.New(runc.Options{StateDir: filepath.Join(dir, "runc-state"), Init: initPath, Namespace: "esf-bench-w"}); err != nil {
			return err
		}
		e.Cleanup(func() error { runctest.RemoveCgroupParents("esf-bench-w"); return nil })
	}

	// Worker A also serves its API on loopback, the address B forwards to.
	lnA, err := api.ListenTCP("tcp://127.0.0.1:0", api.NetworkOptions{Insecure: true})
	if err != nil {
		return err
	}
	worker := func(id, addr string) func(*fabric.Options) {
		return func(o *fabric.Options) {
			s, err := journaletcd.Open(ctx, journaletcd.Options{Endpoints: cluster.Endpoints(), Prefix: "workers"})
			if err != nil {
				panic(err) // StartDaemon has no error path for configure
			}
			reg, err := s.Register(ctx, journaletcd.Worker{ID: id, Addr: addr}, 10*time.Second)
			if err != nil {
				panic(err)
			}
			e.Cleanup(func() error { return errors.Join(reg.Close(), s.Close()) })
			o.JournalStore, o.Cluster = s, &fabric.Cluster{Store: s, Registration: reg}
			if ex != nil && id == "wa" {
				o.Executor = ex
			}
		}
	}
	a, node, err := execDaemon(ctx, e, "wa", rootfs, worker("wa", "http://"+lnA.Addr().String()))
	if err != nil {
		lnA.Close()
		return err
	}
	b, err := e.StartDaemon(ctx, "wb", worker("wb", ""))
	if err != nil {
		lnA.Close()
		return err
	}
	// B holds the same content (one import away), so it can fork too.
	imp, err := b.Ops.Import(ctx, rootfs)
	if err != nil {
		lnA.Close()
		return err
	}
	serve := func(run func(context.Context) error) {
		sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan error, 1)
		go func() { done <- run(sctx) }()
		e.Cleanup(func() error { stop(); return <-done })
	}
	srvA := api.NewServer(a.Fabric, api.ServerOptions{})
	serve(func(ctx context.Context) error { return srvA.Serve(ctx, lnA, 10*time.Second) })
	sockB := filepath.Join(dir, "wb-forwarding.sock")
	lnB, err := api.Listen(sockB)
	if err != nil {
		return err
	}
	srvB := api.NewServer(b.Fabric, api.ServerOptions{Forward: &api.ForwardOptions{}})
	serve(func(ctx context.Context) error { return srvB.Serve(ctx, lnB, 10*time.Second) })
	viaB := client.NewClient(sockB)
	e.Cleanup(func() error { viaB.Close(); return nil })

	// Forks/s: 64 clients, each forking the root of a group of its own,
	// so that they contend on the journal, not on one node.
	const clients = 64
	parents := make([]string, clients)
	for i := range parents {
		g, err := a.Ops.CreateGroup(ctx, imp.RootID)
		if err != nil {
			return err
		}
		parents[i] = g.Node.NodeID
	}
	perClient := e.Size(4, 10)
	round := func(spread bool) func(ctx context.Context) (bench.Measurement, error) {
		return func(ctx context.Context) (bench.Measurement, error) {
			return bench.Timed(float64(clients*perClient), func() error {
				var wg sync.WaitGroup
				errs := make([]error, clients)
				for i := range clients {
					d := a
					if spread && i%2 == 1 {
						d = b
					}
					wg.Go(func() {
						for range perClient {
							if _, err := d.Ops.Fork(ctx, parents[i], 1); err != nil {
								errs[i] = err
								return
							}
						}
					})
				}
				wg.Wait()
				return errors.Join(errs...)
			})
		}
	}
	if _, err := bench.Interleave(ctx, 1, round(true), round(false)); err != nil {
		return err
	}
	ms, err := bench.Interleave(ctx, e.Size(3, 5), round(true), round(false))
	if err != nil {
		return err
	}
	two, one := bench.Rates(ms[0], 1), bench.Rates(ms[1], 1)
	e.Add(bench.Row{Name: "forks/s, 64 clients spread over 2 workers", Value: two.P50, Unit: "forks/s", P90: two.P90, N: two.N, Samples: two.Values,
		Baseline: "the same 64 clients on one worker", BaselineValue: one.P50, Path: a.Ops.Path("fork"),
		Note: fmt.Sprintf("%d forks per client per round, each client the root of its own group; 3-member etcd on loopback, fsync on", perClient)})

	if ex == nil {
		e.Add(bench.Row{Name: "exec through a forwarding worker", Verdict: bench.VerdictSkip, Note: runctest.Check().Error()})
		return nil
	}
	at, err := a.Ops.ActivateAttempt(ctx, fabric.ActivateRequest{NodeID: node, Executor: fabric.ExecutorRunc})
	if err != nil {
		return err
	}
	e.Cleanup(func() error { return a.Ops.Release(context.Background(), at.AttemptID) })
	execOn := func(c *client.Client) bench.Subject {
		return func(ctx context.Context) (bench.Measurement, error) {
			return bench.Timed(1, func() error {
				res, err := c.Exec(ctx, v1.ExecRequest{AttemptID: at.AttemptID, Args: []string{"true"}}, io.Discard, io.Discard)
				if err == nil && res.ExitCode != 0 {
					err = fmt.Errorf("exec true: exit %d", res.ExitCode)
				}
				return err
			})
		}
	}
	if _, err := bench.Interleave(ctx, 2, execOn(viaB), execOn(a.Client)); err != nil {
		return err
	}
	xs, err := bench.Interleave(ctx, e.Size(10, 30), execOn(viaB), execOn(a.Client))
	if err != nil {
		return err
	}
	fw, direct := bench.Latencies(xs[0]), bench.Latencies(xs[1])
	e.Add(bench.Row{Name: "exec true through a forwarding worker", Value: fw.P50, Unit: "ms", P90: fw.P90, N: fw.N, Samples: fw.Values,
		Baseline: "exec true on the owner directly", BaselineValue: direct.P50, Path: "api",
		Note: "B looks up the owner in the journal and its address in the registrations, then proxies over HTTP on loopback"})
	return nil
}
