package bench_test

import (
	"context"

	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/executor/runc"
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
	rig, err := newRuncRig(e, "runc-userns", rowName)
	if rig == nil || err != nil {
		return err
	}
	idmap, err := delta.NewIDMap(1<<30, 65536)
	if err != nil {
		return err
	}
	e.Cleanup(idmap.Close)
	var nodes [2]string
	var daemons [2]*bench.Daemon
	for i, userns := range []bool{true, false} {
		o := runc.Options{Namespace: "esf-bench-userns"}
		var configure func(*fabric.Options)
		if userns {
			o.UserNS = runc.IDRange{Start: idmap.Start, Count: idmap.Count}
			configure = func(fo *fabric.Options) { fo.IDMap = idmap }
		}
		d, node, _, err := rig.daemon(ctx, []string{"runc-userns", "runc-root"}[i], o, configure)
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
