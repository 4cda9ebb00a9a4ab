package bench

import (
	"context"

	"github.com/esf-dev/esf/fabric"
)

// Disk limits (issue 15): what the btrfs pool (fabric.Options.
// DefaultDiskBytes, delta.Pool) adds to an activation: a subvolume and its
// qgroup limit per delta.

func init() {
	Register(Scenario{Name: "activate-disk", Order: 41, Run: benchActivateDisk})
}

func benchActivateDisk(ctx context.Context, e *Env) error {
	tree, err := e.Tree(ctx, e.Size(1_000, 10_000))
	if err != nil {
		return err
	}
	plain, err := e.StartDaemon(ctx, "nodisk")
	if err != nil {
		return err
	}
	limited, err := e.StartDaemon(ctx, "disk", func(o *fabric.Options) { o.DefaultDiskBytes = 10 << 30 })
	if err != nil {
		return err
	}
	activate := func(d *Daemon) (Subject, error) {
		imp, err := d.Ops.Import(ctx, tree)
		if err != nil {
			return nil, err
		}
		g, err := d.Ops.CreateGroup(ctx, imp.RootID)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) (Measurement, error) {
			kids, err := d.Ops.Fork(ctx, g.Node.NodeID, 1)
			if err != nil {
				return Measurement{}, err
			}
			var aid string
			m, err := Timed(1, func() error {
				var err error
				aid, _, err = d.Ops.Activate(ctx, kids[0])
				return err
			})
			if err != nil {
				return m, err
			}
			return m, d.Ops.Release(ctx, aid)
		}, nil
	}
	without, err := activate(plain)
	if err != nil {
		return err
	}
	with, err := activate(limited)
	if err != nil {
		return err
	}
	if _, err := Interleave(ctx, 5, without, with); err != nil {
		return err
	}
	ms, err := Interleave(ctx, e.Size(30, 60), without, with)
	if err != nil {
		return err
	}
	wo, wi := Latencies(ms[0]), Latencies(ms[1])
	e.Add(Row{Name: "activate a draft with a disk limit", Value: wi.P50, Unit: "ms", P90: wi.P90, N: wi.N, Samples: wi.Values,
		Baseline: "activate a draft without one", BaselineValue: wo.P50, Targets: []Target{RatioAtMost(1.2)}, Path: limited.Ops.Path("activate"),
		Note: "the delta is a btrfs subvolume with a qgroup limit in a loop-backed pool under the state dir (two ioctls before the overlay mount)"})
	return nil
}
