package bench_test

import (
	"context"
	"path/filepath"

	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/fabric"
)

// The cost of the user namespace (issue 15): the same activation and first
// exec with the container's root mapped to an unprivileged host range and
// the root an idmapped delta, against a daemon that runs containers as host
// root, interleaved.

func init() {
	bench.Register(bench.Scenario{Name: "runc-userns", Order: 76, Replaces: []string{"runc-userns"}, Run: benchUserNS})
}

func benchUserNS(ctx context.Context, e *bench.Env) error {
	const rowName = "runc activate + first exec, user namespace"
	if err := runctest.Check(); err != nil {
		e.Add(bench.Row{Name: rowName, Verdict: bench.VerdictSkip, Note: err.Error()})
		return nil
	}
	initPath, err := sharedInit()
	if err != nil {
		return err
	}
	dir, err := e.Mkdir("runc-userns")
	if err != nil {
		return err
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := busyboxRootfs(rootfs); err != nil {
		return err
	}
	idmap, err := delta.NewIDMap(1<<30, 65536)
	if err != nil {
		return err
	}
	e.Cleanup(idmap.Close)
	e.Cleanup(func() error { runctest.RemoveCgroupParents("esf-bench-userns"); return nil })
	var nodes [2]string
	var daemons [2]*bench.Daemon
	for i, userns := range []bool{true, false} {
		o := runc.Options{StateDir: filepath.Join(dir, "runc-state", []string{"userns", "root"}[i]), Init: initPath, Namespace: "esf-bench-userns"}
		if userns {
			o.UserNS = runc.IDRange{Start: idmap.Start, Count: idmap.Count}
		}
		ex, err := runc.New(o)
		if err != nil {
			return err
		}
		d, node, err := execDaemon(ctx, e, []string{"runc-userns", "runc-root"}[i], rootfs, func(fo *fabric.Options) {
			fo.Executor = ex
			if userns {
				fo.IDMap = idmap
			}
		})
		if err != nil {
			return err
		}
		daemons[i], nodes[i] = d, node
	}
	run := func(i int) func(context.Context) (bench.Measurement, error) {
		return func(ctx context.Context) (bench.Measurement, error) {
			return activateAndRun(ctx, daemons[i], nodes[i], fabric.ExecutorRunc, fabric.ExecRequest{Args: []string{"true"}})
		}
	}
	if _, err := bench.Interleave(ctx, 1, run(0), run(1)); err != nil { // warm-up
		return err
	}
	ms, err := bench.Interleave(ctx, e.Size(5, 15), run(0), run(1))
	if err != nil {
		return err
	}
	with, without := bench.Latencies(ms[0]), bench.Latencies(ms[1])
	e.Add(bench.Row{Name: rowName, Value: with.P50, Unit: "ms", P90: with.P90, N: with.N, Samples: with.Values,
		Baseline: "without user namespace", BaselineValue: without.P50, Targets: []bench.Target{bench.RatioAtMost(1.2)},
		Path: daemons[0].Ops.Path("activate"),
		Note: "activate --executor runc + exec true through the API, busybox rootfs, container root mapped to an unprivileged range (idmapped delta, rootfs bind for runc); baseline: the same on a daemon running containers as host root"})
	return nil
}
