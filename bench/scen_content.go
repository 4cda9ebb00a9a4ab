package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Import and export against cp -a and tar, on the same file system.
//
// Import is durable when it returns (every object fsynced, then its
// directory), so both sides end with syncfs: import + syncfs against
// cp -a + syncfs. Export does not fsync, and neither side syncs.

func init() {
	Register(Scenario{Name: "import", Order: 10, Run: benchImport})
	Register(Scenario{Name: "export", Order: 20, Run: benchExport})
}

// fmtCount renders a file or node count as the row names use it.
func fmtCount(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// fmtSize renders a byte count as the row names use it.
func fmtSize(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

const mib = 1 << 20

// randomBuffer is 1 MiB of incompressible bytes for write tests.
func randomBuffer(seed uint64) []byte {
	b := make([]byte, mib)
	newRand(seed).Read(b)
	return b
}

// writeFsync writes size bytes (buf repeated, each MiB stamped with its
// offset and seed so no two are alike) to a new file and fsyncs it: the
// disk's durable sequential write speed.
func writeFsync(path string, size int64, buf []byte, seed uint64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	for off := int64(0); off < size; off += int64(len(buf)) {
		n := min(int64(len(buf)), size-off)
		stamp(buf, off, seed)
		if _, err := f.Write(buf[:n]); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// stamp makes buf's first 16 bytes unique to (off, seed).
func stamp(buf []byte, off int64, seed uint64) {
	for i := range 8 {
		buf[i] = byte(off >> (8 * i))
		buf[8+i] = byte(seed >> (8 * i))
	}
}

func benchImport(ctx context.Context, e *Env) error {
	big, err := e.Big(ctx)
	if err != nil {
		return err
	}
	n := e.LargeTree()
	tree, err := e.Tree(ctx, n)
	if err != nil {
		return err
	}
	bigSize := float64(e.BigSize())
	buf := randomBuffer(7)
	reps := e.Size(2, 3)
	var last *Daemon // the last daemon the tree went to, for the re-import
	// Each import goes to a fresh daemon (state dir), so all its content
	// is new to the store, as cp -a writes all of it.
	importInto := func(src string, work float64, keep bool) Subject {
		return func(ctx context.Context) (Measurement, error) {
			d, err := e.StartDaemon(ctx, "import")
			if err != nil {
				return Measurement{}, err
			}
			m, err := Timed(work, func() error {
				if _, err := d.Ops.Import(ctx, src); err != nil {
					return err
				}
				return syncfs(d.StateDir)
			})
			// Close (untimed) all but the daemon the re-import uses; their
			// state stays until the run ends, as deleting written-back files
			// is slow here and would disturb the next measurements.
			if keep {
				d, last = last, d
			}
			if d != nil {
				err = errors.Join(err, d.Close())
			}
			return m, err
		}
	}
	cpInto := func(src string, work float64) Subject {
		return func(ctx context.Context) (Measurement, error) {
			dst, err := e.Mkdir("cp")
			if err != nil {
				return Measurement{}, err
			}
			m, err := Timed(work, func() error {
				if err := run(ctx, "cp", "-a", src, dst+"/"); err != nil {
					return err
				}
				return syncfs(dst)
			})
			return m, err
		}
	}
	seq := uint64(0)
	fsyncWrite := func(ctx context.Context) (Measurement, error) {
		dst, err := e.Mkdir("fsync")
		if err != nil {
			return Measurement{}, err
		}
		seq++
		p := filepath.Join(dst, "f")
		m, err := Timed(bigSize, func() error { return writeFsync(p, e.BigSize(), buf, seq) })
		os.Remove(p)
		return m, err
	}
	e.Logf("  %d reps of: import %s, cp -a, fsync write, import %s files, cp -a", reps, fmtSize(e.BigSize()), fmtCount(n))
	ms, err := Interleave(ctx, reps,
		importInto(big, bigSize, false), cpInto(big, bigSize), fsyncWrite,
		importInto(tree, float64(n), true), cpInto(tree, float64(n)))
	if err != nil {
		return err
	}
	impBig, cpBig, fw := Rates(ms[0], mib), Rates(ms[1], mib), Rates(ms[2], mib)
	impTree, cpTree := Rates(ms[3], 1), Rates(ms[4], 1)
	bigName := fmt.Sprintf("import 1 file of %s", fmtSize(e.BigSize()))
	e.Add(Row{Name: bigName, Value: impBig.P50, Unit: "MiB/s", P90: impBig.P90, N: impBig.N, Samples: impBig.Values,
		Baseline: "cp -a + syncfs", BaselineValue: cpBig.P50, Path: "api"})
	e.Add(Row{Name: bigName + " vs disk", Value: impBig.P50, Unit: "MiB/s", N: impBig.N, Samples: impBig.Values,
		Baseline: "write + fsync", BaselineValue: fw.P50, Targets: []Target{RatioAtLeast(0.8)}, Path: "api",
		Note: "import + syncfs into a fresh store; baseline: sequential 1 MiB writes of new data and one fsync"})
	e.Add(Row{Name: fmt.Sprintf("import %s small files", fmtCount(n)), Value: impTree.P50, Unit: "files/s", P90: impTree.P90, N: impTree.N, Samples: impTree.Values,
		Baseline: "cp -a + syncfs", BaselineValue: cpTree.P50, Path: "api",
		Note: fmt.Sprintf("files of 0..4 KiB in dirs of 100; fresh store per rep; %d reps interleaved with cp -a", reps)})

	// Re-import of the same tree into the last daemon: nothing new.
	var newObjects int64
	reimport := func(ctx context.Context) (Measurement, error) {
		return Timed(float64(n), func() error {
			r, err := last.Ops.Import(ctx, tree)
			newObjects += r.NewObjects
			return err
		})
	}
	walk := func(ctx context.Context) (Measurement, error) {
		return Timed(float64(n), func() error { _, err := statWalk(tree); return err })
	}
	ms, err = Interleave(ctx, reps, reimport, walk)
	if err != nil {
		return err
	}
	ri, sw := Seconds(ms[0]), Seconds(ms[1])
	e.Add(Row{Name: fmt.Sprintf("re-import %s files: new objects", fmtCount(n)), Value: float64(newObjects), Unit: "objects",
		N: reps, Targets: []Target{AtMost(0)}, Path: "api"})
	e.Add(Row{Name: fmt.Sprintf("re-import %s files", fmtCount(n)), Value: ri.P50, Unit: "s", P90: ri.P90, N: ri.N, Samples: ri.Values,
		Baseline: "lstat walk", BaselineValue: sw.P50, Targets: []Target{RatioAtMost(1.5)}, Path: "api",
		Note: "warm page cache; the daemon's stat cache (dev, ino, size, mtime, ctime, as git's index) lets the re-import skip reading unchanged files: it lstat()s and asks the store per file (xattrs are remembered; the cache holds up to a million files in 72-byte entries); the walk only lstat()s"})
	return nil
}

func benchExport(ctx context.Context, e *Env) error {
	d, err := e.Main(ctx)
	if err != nil {
		return err
	}
	big, err := e.Big(ctx)
	if err != nil {
		return err
	}
	n := e.LargeTree()
	tree, err := e.Tree(ctx, n)
	if err != nil {
		return err
	}
	bigRoot, err := e.Root(ctx, big)
	if err != nil {
		return err
	}
	treeRoot, err := e.Root(ctx, tree)
	if err != nil {
		return err
	}
	bigSize := float64(e.BigSize())
	// Outputs are deleted right after each run (untimed): neither side
	// syncs, so they are mostly not written back yet, and deleting them is
	// cheap (see removeAll).
	exportDir := func(id string, work float64) Subject {
		return func(ctx context.Context) (Measurement, error) {
			dst, err := e.Mkdir("export")
			if err != nil {
				return Measurement{}, err
			}
			out := filepath.Join(dst, "out")
			m, err := Timed(work, func() error { return d.Ops.ExportDir(ctx, id, out) })
			return m, errors.Join(err, removeAll(dst))
		}
	}
	cpDir := func(src string, work float64) Subject {
		return func(ctx context.Context) (Measurement, error) {
			dst, err := e.Mkdir("cp")
			if err != nil {
				return Measurement{}, err
			}
			out := filepath.Join(dst, "out")
			m, err := Timed(work, func() error { return run(ctx, "cp", "-a", src, out) })
			return m, errors.Join(err, removeAll(dst))
		}
	}
	exportTar := func(id string, work float64) Subject {
		return func(ctx context.Context) (Measurement, error) {
			dst, err := e.Mkdir("tar")
			if err != nil {
				return Measurement{}, err
			}
			p := filepath.Join(dst, "out.tar")
			m, err := Timed(work, func() error {
				f, err := os.Create(p)
				if err != nil {
					return err
				}
				if err := d.Ops.ExportTar(ctx, id, f); err != nil {
					f.Close()
					return err
				}
				return f.Close()
			})
			os.Remove(p)
			return m, err
		}
	}
	tarDir := func(src string, work float64) Subject {
		return func(ctx context.Context) (Measurement, error) {
			dst, err := e.Mkdir("tar")
			if err != nil {
				return Measurement{}, err
			}
			p := filepath.Join(dst, "out.tar")
			m, err := Timed(work, func() error { return run(ctx, "tar", "-cf", p, "-C", src, ".") })
			os.Remove(p)
			return m, err
		}
	}
	reps := e.Size(2, 3) // bench-quick has 5 minutes in all
	ms, err := Interleave(ctx, reps,
		exportDir(treeRoot, float64(n)), cpDir(tree, float64(n)),
		exportTar(treeRoot, float64(n)), tarDir(tree, float64(n)),
		exportDir(bigRoot, bigSize), cpDir(big, bigSize),
		exportTar(bigRoot, bigSize), tarDir(big, bigSize))
	if err != nil {
		return err
	}
	rows := []struct {
		name, base string
		scale      float64
		unit       string
		atLeast    float64 // issue 21, item 4
	}{
		{fmt.Sprintf("export %s files to a dir", fmtCount(n)), "cp -a", 1, "files/s", 1.0},
		{fmt.Sprintf("export %s files as a tar", fmtCount(n)), "tar -cf", 1, "files/s", 0.8},
		{fmt.Sprintf("export 1 file of %s to a dir", fmtSize(e.BigSize())), "cp -a", mib, "MiB/s", 0.8},
		{fmt.Sprintf("export 1 file of %s as a tar", fmtSize(e.BigSize())), "tar -cf", mib, "MiB/s", 0.8},
	}
	for i, r := range rows {
		s, b := Rates(ms[2*i], r.scale), Rates(ms[2*i+1], r.scale)
		row := Row{Name: r.name, Value: s.P50, Unit: r.unit, P90: s.P90, N: s.N, Samples: s.Values, Baseline: r.base, BaselineValue: b.P50,
			Targets: []Target{RatioAtLeast(r.atLeast)}, Path: "api"}
		if i == 0 {
			row.Note = "no fsync on either side; the store's objects and the source are in the page cache; tar goes to a file through the API stream"
		}
		e.Add(row)
	}
	return nil
}
