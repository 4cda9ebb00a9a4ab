package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/etcdtest"
	"github.com/esf-dev/esf/internal/testenv"
	journaletcd "github.com/esf-dev/esf/journal/etcd"
)

// The journal on etcd (issue 20): fork, activate and seal through the API
// of a daemon whose journal is on a 3-member etcd cluster on loopback
// (fsync on, on the same disk), against the same operations of a daemon
// on the embedded pebble journal, interleaved in the same run. Both
// daemons hold the same small group, so the difference is the journal.

func init() {
	bench.Register(bench.Scenario{Name: "etcd", Order: 90, Run: benchEtcd})
}

func benchEtcd(ctx context.Context, e *bench.Env) error {
	if err := testenv.Check("etcd"); err != nil {
		e.TODO("journal on etcd", fmt.Sprintf("%v (make bench sets it)", err))
		return nil
	}
	dir, err := e.Mkdir("etcd")
	if err != nil {
		return err
	}
	cluster, err := etcdtest.StartCluster(etcdtest.Options{Members: 3, Dir: dir})
	if err != nil {
		return err
	}
	e.Cleanup(func() error { cluster.Stop(); return nil })
	src, err := e.Tree(ctx, 100)
	if err != nil {
		return err
	}
	pebble, pnode, err := execDaemon(ctx, e, "pebble", src, func(*fabric.Options) {})
	if err != nil {
		return err
	}
	var openErr error
	etcd, enode, err := execDaemon(ctx, e, "etcd", src, func(o *fabric.Options) {
		s, err := journaletcd.Open(ctx, journaletcd.Options{Endpoints: cluster.Endpoints(), Prefix: "bench"})
		if err != nil {
			openErr = err
			return
		}
		o.JournalStore = s
	})
	if err != nil || openErr != nil {
		return fmt.Errorf("daemon on etcd: %v %v", err, openErr)
	}

	fork := func(d *bench.Daemon, node string) bench.Subject {
		return func(ctx context.Context) (bench.Measurement, error) {
			return bench.Timed(1, func() error { _, err := d.Ops.Fork(ctx, node, 1); return err })
		}
	}
	activate := func(d *bench.Daemon, node string) bench.Subject {
		return func(ctx context.Context) (bench.Measurement, error) {
			kids, err := d.Ops.Fork(ctx, node, 1)
			if err != nil {
				return bench.Measurement{}, err
			}
			var aid string
			m, err := bench.Timed(1, func() error {
				var err error
				aid, _, err = d.Ops.Activate(ctx, kids[0])
				return err
			})
			if err != nil {
				return m, err
			}
			return m, d.Ops.Release(ctx, aid)
		}
	}
	rep := 0
	seal := func(d *bench.Daemon, node string) bench.Subject {
		return func(ctx context.Context) (bench.Measurement, error) {
			kids, err := d.Ops.Fork(ctx, node, 1)
			if err != nil {
				return bench.Measurement{}, err
			}
			aid, root, err := d.Ops.Activate(ctx, kids[0])
			if err != nil {
				return bench.Measurement{}, err
			}
			rep++
			if err := os.WriteFile(filepath.Join(root, "change.txt"), []byte(fmt.Sprintf("change %d\n", rep)), 0o644); err != nil {
				return bench.Measurement{}, err
			}
			return bench.Timed(1, func() error { _, err := d.Ops.Suspend(ctx, aid); return err })
		}
	}
	for _, op := range []struct {
		name string
		mk   func(*bench.Daemon, string) bench.Subject
		reps int
		note string
	}{
		{"fork", fork, e.Size(40, 100), "one journal commit"},
		{"activate", activate, e.Size(20, 50), "executor none: one commit and the overlay mount"},
		{"seal one small change", seal, e.Size(15, 30), "several journal commits (quiesce, seal, release) and the CAS batch"},
	} {
		subjects := []bench.Subject{op.mk(pebble, pnode), op.mk(etcd, enode)}
		if _, err := bench.Interleave(ctx, 3, subjects...); err != nil {
			return err
		}
		ms, err := bench.Interleave(ctx, op.reps, subjects...)
		if err != nil {
			return err
		}
		p, x := bench.Latencies(ms[0]), bench.Latencies(ms[1])
		e.Add(bench.Row{Name: op.name + " on a 3-member etcd journal", Value: x.P50, Unit: "ms", P90: x.P90, N: x.N, Samples: x.Values,
			Baseline: op.name + " on the pebble journal", BaselineValue: p.P50, Path: etcd.Ops.Path("fork"),
			Note: op.note + "; etcd: 3 members on loopback, fsync on, same disk"})
	}
	return nil
}
