package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Graph operations: fork against the root's size and the graph's size,
// inspect, and the daemon's memory with a large graph.

func init() {
	Register(Scenario{Name: "graph", Order: 5, Run: benchGraphScale})
	Register(Scenario{Name: "fork", Order: 30, Run: benchForkRoots})
}

// fdatasyncSubject appends 4 KiB to a file and fdatasyncs it: the floor
// under every durable commit (pebble's WAL sync is one).
func (e *Env) fdatasyncSubject() (Subject, error) {
	dir, err := e.Mkdir("fdatasync")
	if err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, "wal"))
	if err != nil {
		return nil, err
	}
	e.Cleanup(f.Close)
	buf := make([]byte, 4096)
	return func(context.Context) (Measurement, error) {
		return Timed(1, func() error {
			if _, err := f.Write(buf); err != nil {
				return err
			}
			return unix.Fdatasync(int(f.Fd()))
		})
	}, nil
}

// waitQuiet waits until no file under dir has changed (size, mtime or
// name) for quiet, or for at most max, and returns how long it waited.
func waitQuiet(ctx context.Context, dir string, quiet, max time.Duration) time.Duration {
	start := time.Now()
	state := func() string {
		var b strings.Builder
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if info, err := d.Info(); err == nil {
					fmt.Fprintf(&b, "%s %d %d\n", p, info.Size(), info.ModTime().UnixNano())
				}
			}
			return nil
		})
		return b.String()
	}
	last, since := state(), time.Now()
	for time.Since(start) < max && ctx.Err() == nil {
		time.Sleep(500 * time.Millisecond)
		if now := state(); now != last {
			last, since = now, time.Now()
		} else if time.Since(since) >= quiet {
			break
		}
	}
	return time.Since(start)
}

// rssMiB is this process's resident set (VmRSS) in MiB.
func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func freeMemory() {
	runtime.GC()
	debug.FreeOSMemory()
}

func benchGraphScale(ctx context.Context, e *Env) error {
	bigN := e.Size(50_000, 1_000_000)
	const smallN = 1000
	src, err := e.Tree(ctx, 10)
	if err != nil {
		return err
	}
	// Two daemons, so the small graph's journal holds only the small graph.
	// They run before any other scenario, so the process holds little else
	// when its memory is read.
	small, err := e.StartDaemon(ctx, "graph-1k")
	if err != nil {
		return err
	}
	large, err := e.StartDaemon(ctx, "graph-"+fmtCount(bigN))
	if err != nil {
		return err
	}
	groupOf := func(d *Daemon) (string, error) {
		r, err := d.Ops.Import(ctx, src)
		if err != nil {
			return "", err
		}
		g, err := d.Ops.CreateGroup(ctx, r.RootID)
		return g.Node.NodeID, err
	}
	rootSmall, err := groupOf(small)
	if err != nil {
		return err
	}
	rootLarge, err := groupOf(large)
	if err != nil {
		return err
	}
	leafSmall, err := small.Ops.Fork(ctx, rootSmall, smallN-1)
	if err != nil {
		return err
	}
	freeMemory()
	rssBefore := rssMiB()

	// The large graph: the root and batches of drafts (drafts cannot fork,
	// so the graph is wide; fork and inspect of a leaf do not depend on the
	// shape). Batches of 2000 (MaxFork is 10000), as the rows of earlier
	// runs were measured.
	const batch = 2000
	var batches []Measurement
	var leafLarge string
	start := time.Now()
	for made := 1; made < bigN; made += batch {
		k := min(batch, bigN-made)
		var ids []string
		m, err := Timed(float64(k), func() error {
			var err error
			ids, err = large.Ops.Fork(ctx, rootLarge, k)
			return err
		})
		if err != nil {
			return err
		}
		batches = append(batches, m)
		leafLarge = ids[len(ids)/2]
	}
	e.Logf("  built a %s-node graph in %v", fmtCount(bigN), time.Since(start).Round(time.Millisecond))
	rssBuilt := rssMiB()
	// A daemon's graph grows over hours; measure it at rest, once the
	// compactions the bulk load started are over.
	settled := waitQuiet(ctx, filepath.Join(large.StateDir, "journal"), 5*time.Second, 3*time.Minute)
	e.Logf("  journal at rest after %v", settled.Round(time.Second))
	freeMemory()
	rssGC := rssMiB()

	reps := e.Size(200, 300)
	fork := func(d *Daemon, node string) Subject {
		return func(ctx context.Context) (Measurement, error) {
			return Timed(1, func() error { _, err := d.Ops.Fork(ctx, node, 1); return err })
		}
	}
	inspect := func(d *Daemon, id string) Subject {
		return func(ctx context.Context) (Measurement, error) {
			return Timed(1, func() error { return d.Ops.Inspect(ctx, id) })
		}
	}
	// Warm up both daemons (connections, caches), then measure.
	if _, err := Interleave(ctx, 20, fork(small, rootSmall), fork(large, rootLarge),
		inspect(small, leafSmall[0]), inspect(large, leafLarge)); err != nil {
		return err
	}
	ms, err := Interleave(ctx, reps, fork(small, rootSmall), fork(large, rootLarge),
		inspect(small, leafSmall[len(leafSmall)/2]), inspect(large, leafLarge))
	if err != nil {
		return err
	}
	fs, fl, is, il := Latencies(ms[0]), Latencies(ms[1]), Latencies(ms[2]), Latencies(ms[3])
	bigName := fmtCount(bigN)
	path := small.Ops.Path("fork")
	e.Add(Row{Name: "fork, graph of 1k nodes", Value: fs.P50, Unit: "ms", P90: fs.P90, N: fs.N, Samples: fs.Values,
		Targets: []Target{AtMost(1)}, Path: path})
	e.Add(Row{Name: "fork, graph of " + bigName + " nodes", Value: fl.P50, Unit: "ms", P90: fl.P90, N: fl.N, Samples: fl.Values,
		Baseline: "fork, graph of 1k nodes", BaselineValue: fs.P50, Targets: []Target{AtMost(1), RatioAtMost(1.5)}, Path: path,
		Note: "fork -n 1 of the group's root node, which has all the other nodes as children; two daemons in one process, interleaved; measured once the large journal's files stopped changing (compactions over)"})
	path = small.Ops.Path("inspect")
	e.Add(Row{Name: "inspect a leaf, graph of 1k nodes", Value: is.P50, Unit: "ms", P90: is.P90, N: is.N, Samples: is.Values, Path: path})
	e.Add(Row{Name: "inspect a leaf, graph of " + bigName + " nodes", Value: il.P50, Unit: "ms", P90: il.P90, N: il.N, Samples: il.Values,
		Baseline: "inspect, graph of 1k nodes", BaselineValue: is.P50, Targets: []Target{RatioAtMost(1.5)}, Path: path})
	b := Rates(batches, 1)
	bl := Latencies(batches)
	e.Add(Row{Name: fmt.Sprintf("fork -n %s (building the graph)", fmtCount(batch)), Value: b.P50, Unit: "nodes/s", N: b.N, Samples: b.Values,
		Path: large.Ops.Path("fork"), Note: fmt.Sprintf("p50 %.0f ms per batch of %d drafts", bl.P50, batch)})
	rssNote := "VmRSS of the whole benchmark process (two in-process daemons with their API servers, and the harness); esfd alone is less"
	e.Add(Row{Name: "RSS with a " + bigName + "-node graph", Value: rssBuilt, Unit: "MiB",
		Baseline: "RSS before building it", BaselineValue: rssBefore, Targets: []Target{AtMost(256)}, Note: rssNote})
	e.Add(Row{Name: "RSS with a " + bigName + "-node graph, after GC", Value: rssGC, Unit: "MiB",
		Baseline: "RSS before building it", BaselineValue: rssBefore, Targets: []Target{AtMost(256)},
		Note: "after runtime.GC and debug.FreeOSMemory"})
	return nil
}

func benchForkRoots(ctx context.Context, e *Env) error {
	sizes := []int{10, e.Size(1000, 10_000), e.LargeTree()}
	nodes := make([]string, len(sizes))
	for i, n := range sizes {
		dir, err := e.Tree(ctx, n)
		if err != nil {
			return err
		}
		g, err := e.Group(ctx, dir)
		if err != nil {
			return err
		}
		nodes[i] = g.Node.NodeID
	}
	d, err := e.Main(ctx)
	if err != nil {
		return err
	}
	fsync, err := e.fdatasyncSubject()
	if err != nil {
		return err
	}
	subjects := []Subject{fsync}
	for _, node := range nodes {
		subjects = append(subjects, func(ctx context.Context) (Measurement, error) {
			return Timed(1, func() error { _, err := d.Ops.Fork(ctx, node, 1); return err })
		})
	}
	if _, err := Interleave(ctx, 20, subjects...); err != nil {
		return err
	}
	ms, err := Interleave(ctx, e.Size(150, 300), subjects...)
	if err != nil {
		return err
	}
	fs := Latencies(ms[0])
	e.Add(Row{Name: "fdatasync of a 4 KiB append", Value: fs.P50, Unit: "ms", P90: fs.P90, N: fs.N, Samples: fs.Values, Path: "fs",
		Note: "the floor under any durable commit on this disk"})
	base := Latencies(ms[1])
	path := d.Ops.Path("fork")
	for i, n := range sizes {
		s := Latencies(ms[i+1])
		row := Row{Name: fmt.Sprintf("fork, root of %s files", fmtCount(n)), Value: s.P50, Unit: "ms", P90: s.P90, N: s.N, Samples: s.Values,
			Targets: []Target{AtMost(1)}, Path: path}
		if i == 0 {
			row.Baseline, row.BaselineValue = "fdatasync", fs.P50
		} else {
			row.Baseline, row.BaselineValue = "fork, root of 10 files", base.P50
		}
		if i == len(sizes)-1 {
			row.Targets = append(row.Targets, RatioAtMost(1.2))
		}
		e.Add(row)
	}
	return nil
}
