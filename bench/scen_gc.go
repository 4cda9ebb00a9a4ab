package bench

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/fabric"
)

// Garbage collection (esfctl gc) against deleting the same files by hand.
//
// Garbage is an import no node names: the store holds exactly the
// import's objects (one blob per distinct file, one tree per directory) and
// the graph pins none of them, as after a prune of every node naming that
// root. A collection then lists the store, finds nothing live and deletes
// every object (gc.DefaultWorkers at a time), so its baseline is rm -rf of a
// byte-identical copy of the store's objects directory: same files, same
// sizes, same fan-out. Both sides delete written-back files
// (import fsyncs every object; the copy is synced before it is timed), the
// expensive kind on this disk (see removeAll). A third side unlinks the
// copy with 32 goroutines: what a parallel sweep could reach.
//
// The other row is the fixed cost a user pays on every run: the same
// number of objects, all live (a group names the root), nothing to delete:
// listing the store and walking the live trees, against an lstat walk of
// the objects directory.
//
// Everything runs in a private daemon so that its store holds only this
// scenario's objects. What is left (the live store, the template copy) is
// synced, so it stays until the run ends, like import's stores: deleting
// it now would disturb the next scenario's latencies.

func init() {
	Register(Scenario{Name: "gc", Order: 25, Replaces: []string{"gc"}, Run: benchGC})
}

// collect runs one collection as Ops would: through the API client, or as
// the Fabric method with -bench.fabric.
func collect(ctx context.Context, d *Daemon) (fabric.CollectReport, error) {
	if d.Ops.viaFabric {
		return d.Fabric.Collect(ctx, fabric.CollectRequest{})
	}
	r, err := d.Client.Collect(ctx, v1.CollectRequest{}, apiOpts)
	if err != nil {
		return fabric.CollectReport{}, err
	}
	return fromView[fabric.CollectReport](r)
}

// usage counts the regular files below dir and their bytes.
func usage(dir string) (files, bytes int64, err error) {
	err = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files++
		bytes += info.Size()
		return nil
	})
	return files, bytes, err
}

func benchGC(ctx context.Context, e *Env) error {
	n := e.LargeTree()
	tree, err := e.Tree(ctx, n)
	if err != nil {
		return err
	}
	d, err := e.StartDaemon(ctx, "gc")
	if err != nil {
		return err
	}
	objects := filepath.Join(d.StateDir, "cas", "objects")
	path := d.Ops.Path("gc")

	// The template is the store's objects directory right after the first
	// import, copied once and synced; the baselines delete copies of it.
	var (
		template    string
		objs, bytes int64
	)
	sweep := func(ctx context.Context) (Measurement, error) {
		imp, err := d.Ops.Import(ctx, tree)
		if err != nil {
			return Measurement{}, err
		}
		if template == "" {
			dir, err := e.Mkdir("gc-template")
			if err != nil {
				return Measurement{}, err
			}
			template = filepath.Join(dir, "objects")
			if err := run(ctx, "cp", "-a", objects, template); err != nil {
				return Measurement{}, err
			}
			if err := syncfs(template); err != nil {
				return Measurement{}, err
			}
			if objs, bytes, err = usage(template); err != nil {
				return Measurement{}, err
			}
		}
		if imp.NewObjects != objs {
			return Measurement{}, fmt.Errorf("gc: import stored %d new objects, the store holds %d: the last collection left some behind",
				imp.NewObjects, objs)
		}
		var rep fabric.CollectReport
		m, err := Timed(float64(objs), func() error {
			var err error
			rep, err = collect(ctx, d)
			return err
		})
		if err != nil {
			return m, err
		}
		// Every object was garbage: a collection that deleted less (or
		// reported other bytes) did not do the work the row divides by.
		if rep.Deleted != objs || rep.BytesReclaimed != bytes || rep.Live != 0 {
			return m, fmt.Errorf("gc of %d unreachable objects (%d bytes): deleted %d (%d bytes), live %d, spared %d",
				objs, bytes, rep.Deleted, rep.BytesReclaimed, rep.Live, rep.Spared)
		}
		return m, nil
	}
	// copyTemplate makes a fresh written-back copy of the template.
	copyTemplate := func(ctx context.Context, name string) (string, error) {
		if template == "" {
			return "", fmt.Errorf("gc: no template yet (the sweep must run first)")
		}
		dir, err := e.Mkdir(name)
		if err != nil {
			return "", err
		}
		dst := filepath.Join(dir, "objects")
		if err := run(ctx, "cp", "-a", template, dst); err != nil {
			return "", err
		}
		return dst, syncfs(dst)
	}
	rmrf := func(ctx context.Context) (Measurement, error) {
		dst, err := copyTemplate(ctx, "gc-rm")
		if err != nil {
			return Measurement{}, err
		}
		return Timed(float64(objs), func() error { return run(ctx, "rm", "-rf", dst) })
	}
	unlinkParallel := func(ctx context.Context) (Measurement, error) {
		dst, err := copyTemplate(ctx, "gc-unlink")
		if err != nil {
			return Measurement{}, err
		}
		return Timed(float64(objs), func() error { return removeAll(dst) })
	}
	reps := e.Size(2, 3) // bench-quick has 5 minutes in all
	e.Logf("  %d reps of: import %s files and gc them, rm -rf a copy, parallel unlink of a copy", reps, fmtCount(n))
	// The sweep comes first in the first round: it makes the template.
	ms, err := Interleave(ctx, reps, sweep, rmrf, unlinkParallel)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("gc of %s unreachable files", fmtCount(n))
	s, b := Rates(ms[0], 1), Rates(ms[1], 1)
	secs := Seconds(ms[0])
	e.Add(Row{Name: name + ": objects swept", Value: s.P50, Unit: "objects/s", P90: s.P90, N: s.N, Samples: s.Values,
		Baseline: "rm -rf of a copy", BaselineValue: b.P50, Path: path,
		Note: fmt.Sprintf("%d objects (blobs and trees) of %s, nothing live; p50 %.2f s per collection; baseline: rm -rf of a synced copy of the store's objects dir",
			objs, fmtBytes(bytes), secs.P50)})
	// Every side deletes the same bytes each time (the sweep checks it).
	s, b = Rates(withWork(ms[0], float64(bytes)), mib), Rates(withWork(ms[1], float64(bytes)), mib)
	e.Add(Row{Name: name + ": bytes freed", Value: s.P50, Unit: "MiB/s", P90: s.P90, N: s.N, Samples: s.Values,
		Baseline: "rm -rf of a copy", BaselineValue: b.P50, Path: path})
	s, b = Rates(ms[0], 1), Rates(ms[2], 1)
	e.Add(Row{Name: name + " vs parallel unlink", Value: s.P50, Unit: "objects/s", P90: s.P90, N: s.N, Samples: s.Values,
		Baseline: "32 parallel unlinks", BaselineValue: b.P50, Path: path,
		Note: "the sweep deletes gc.DefaultWorkers (16) objects at a time, each checked against writers first; this baseline is what deleting the same files with 32 goroutines takes"})

	// The same objects, all live.
	imp, err := d.Ops.Import(ctx, tree)
	if err != nil {
		return err
	}
	if _, err := d.Ops.CreateGroup(ctx, imp.RootID); err != nil {
		return err
	}
	if err := syncfs(objects); err != nil {
		return err
	}
	noop := func(ctx context.Context) (Measurement, error) {
		var rep fabric.CollectReport
		m, err := Timed(float64(objs), func() error {
			var err error
			rep, err = collect(ctx, d)
			return err
		})
		if err == nil && (rep.Deleted != 0 || rep.Examined != objs || rep.Live != objs) {
			err = fmt.Errorf("gc of a live store of %d objects: examined %d, live %d, deleted %d", objs, rep.Examined, rep.Live, rep.Deleted)
		}
		return m, err
	}
	walk := func(ctx context.Context) (Measurement, error) {
		return Timed(float64(objs), func() error { _, err := statWalk(objects); return err })
	}
	// One untimed round warms the caches either side reads.
	if _, err := Interleave(ctx, 1, noop, walk); err != nil {
		return err
	}
	ms, err = Interleave(ctx, 3, noop, walk)
	if err != nil {
		return err
	}
	s, b = Seconds(ms[0]), Seconds(ms[1])
	rate := Rates(ms[0], 1)
	e.Add(Row{Name: fmt.Sprintf("gc with nothing to collect, store of %s files", fmtCount(n)), Value: s.P50, Unit: "s", P90: s.P90, N: s.N, Samples: s.Values,
		Baseline: "lstat walk of the objects dir", BaselineValue: b.P50, Path: path,
		Note: fmt.Sprintf("%d objects, all live (a group names the root): list the store, walk every live tree, delete nothing; %.0f objects/s; warm caches", objs, rate.P50)})
	return nil
}

// withWork returns ms with every Work set to work.
func withWork(ms []Measurement, work float64) []Measurement {
	out := make([]Measurement, len(ms))
	for i, m := range ms {
		out[i] = Measurement{Elapsed: m.Elapsed, Work: work}
	}
	return out
}

// fmtBytes renders a byte count for a note.
func fmtBytes(n int64) string {
	if n >= 10*mib {
		return fmt.Sprintf("%d MiB", n/mib)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/mib)
}
