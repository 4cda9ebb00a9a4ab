package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// I/O in an attempt root against native ext4, plain overlayfs on ext4 and
// go-fuse's stock loopback, all over the same data on the same disk.

func init() {
	Register(Scenario{Name: "io", Order: 60, Run: benchIO})
}

// ioTarget is one way of reaching the data.
type ioTarget struct {
	name    string
	big     string // the big file
	tree    string // the large tree
	scratch string // a writable directory; "" for read-only targets
	esf     bool   // the subject the targets apply to
}

const native = "native ext4"

func (e *Env) ioTargets(ctx context.Context) ([]ioTarget, error) {
	bigDir, err := e.Big(ctx)
	if err != nil {
		return nil, err
	}
	tree, err := e.Tree(ctx, e.LargeTree())
	if err != nil {
		return nil, err
	}
	d, err := e.Main(ctx)
	if err != nil {
		return nil, err
	}
	var ts []ioTarget

	scratch, err := e.Mkdir("io-native")
	if err != nil {
		return nil, err
	}
	ts = append(ts, ioTarget{name: native, big: filepath.Join(bigDir, "big.bin"), tree: tree, scratch: scratch})

	// Plain overlayfs with the native data as its lower layer.
	ovBig, err := e.overlayOf(bigDir)
	if err != nil {
		return nil, err
	}
	ovTree, err := e.overlayOf(tree)
	if err != nil {
		return nil, err
	}
	ts = append(ts, ioTarget{name: "overlayfs on ext4", big: filepath.Join(ovBig, "big.bin"), tree: ovTree, scratch: ovBig})

	// go-fuse's loopback of the source directory, in a child process.
	lbDir, err := e.Mkdir("loopback")
	if err != nil {
		return nil, err
	}
	src := filepath.Dir(bigDir)
	lbScratch := filepath.Join(src, "loopback-scratch")
	if err := os.Mkdir(lbScratch, 0o755); err != nil {
		return nil, err
	}
	stop, err := e.startRole(ctx, lbDir, roleLoopback, src, lbDir, e.profilePath("loopback"))
	switch {
	case errors.Is(err, errSkip):
		e.Add(Row{Name: "io: go-fuse loopback", Verdict: VerdictSkip, Note: err.Error()})
	case err != nil:
		return nil, err
	default:
		e.Cleanup(stop)
		ts = append(ts, ioTarget{name: "go-fuse loopback", big: filepath.Join(lbDir, "big", "big.bin"),
			tree: filepath.Join(lbDir, filepath.Base(tree)), scratch: filepath.Join(lbDir, "loopback-scratch")})
	}

	// esf: attempts on the two roots (through the API, as a user would).
	gBig, err := e.Group(ctx, bigDir)
	if err != nil {
		return nil, err
	}
	gTree, err := e.Group(ctx, tree)
	if err != nil {
		return nil, err
	}
	attempt := func(node string) (string, error) {
		kids, err := d.Ops.Fork(ctx, node, 1)
		if err != nil {
			return "", err
		}
		aid, root, err := d.Ops.Activate(ctx, kids[0])
		if err != nil {
			return "", err
		}
		e.Cleanup(func() error { return d.Ops.Release(context.Background(), aid) })
		return root, nil
	}
	aBig, err := attempt(gBig.Node.NodeID)
	if err != nil {
		return nil, err
	}
	aTree, err := attempt(gTree.Node.NodeID)
	if err != nil {
		return nil, err
	}
	ts = append(ts, ioTarget{name: "esf attempt root", big: filepath.Join(aBig, "big.bin"), tree: aTree, scratch: aBig, esf: true})

	// The projection verifies a blob on its first open in a process: a
	// one-time cost a user sees on the first read of a file.
	buf := make([]byte, mib)
	m, err := Timed(float64(e.BigSize()), func() error { _, err := readAll(filepath.Join(aBig, "big.bin"), buf); return err })
	if err != nil {
		return nil, err
	}
	first := Rates([]Measurement{m}, mib)
	e.Add(Row{Name: fmt.Sprintf("first read of %s in an attempt root", fmtSize(e.BigSize())), Value: first.P50, Unit: "MiB/s", N: 1, Path: "fs",
		Note: "the projection hashes a blob on its first open in the server process, before serving a byte"})

	// The read-only projection alone, to tell overlay costs from FUSE ones.
	roots := filepath.Join(d.StateDir, "mnt", "roots")
	ts = append(ts, ioTarget{name: "esf projection (ro)", big: filepath.Join(roots, gBig.Node.RootID, "big.bin"),
		tree: filepath.Join(roots, gTree.Node.RootID)})
	return ts, nil
}

// profilePath is where a helper role writes its CPU profile, if profiling.
func (e *Env) profilePath(name string) string {
	if e.cfg.ProfileDir == "" {
		return ""
	}
	return filepath.Join(e.cfg.ProfileDir, name+".pprof")
}

// overlayOf mounts a plain overlay with lower as its lower layer until the
// scenario ends.
func (e *Env) overlayOf(lower string) (string, error) {
	dir, err := e.Mkdir("overlay")
	if err != nil {
		return "", err
	}
	mnt, err := mountOverlay(lower, dir)
	if err != nil {
		return "", err
	}
	e.Cleanup(func() error { return unix.Unmount(mnt, 0) })
	return mnt, nil
}

// ioTest is one I/O measurement run on every target.
type ioTest struct {
	name     string
	unit     string
	scale    float64 // Work per unit: MiB/s divides bytes by 1<<20
	latency  bool    // report elapsed milliseconds instead of a rate
	writes   bool    // needs a scratch directory
	reps     int
	prepare  func(t ioTarget) error // untimed, once per target before the reps
	run      func(ctx context.Context, t ioTarget, rep int) (Measurement, error)
	targets  []Target // on the esf attempt root's row
	note     string
	baseline string // default native
}

func benchIO(ctx context.Context, e *Env) error {
	ts, err := e.ioTargets(ctx)
	if err != nil {
		return err
	}
	size := e.BigSize()
	n := e.LargeTree()
	paths := TreePaths(n)
	buf := make([]byte, mib)
	wbuf := randomBuffer(17)
	creates := e.Size(1000, 10_000) // quick: creates on this disk pay for recent deletions (~30 s at 3k)
	randomReads := e.Size(20_000, 50_000)

	seqRead := func(ctx context.Context, t ioTarget, _ int) (Measurement, error) {
		var got int64
		m, err := Timed(float64(size), func() error {
			var err error
			got, err = readAll(t.big, buf)
			return err
		})
		if err == nil && got != size {
			err = fmt.Errorf("read %d bytes of %s, want %d", got, t.big, size)
		}
		return m, err
	}
	warm := func(t ioTarget) error { _, err := readAll(t.big, buf); return err }

	var tests []ioTest
	if canDropCaches() {
		tests = append(tests, ioTest{
			name: fmt.Sprintf("cold sequential read of %s", fmtSize(size)), unit: "MiB/s", scale: mib, reps: e.Size(3, 5),
			// The first read also verifies the blob once per projection
			// process; do it before the cold runs.
			prepare: warm,
			run: func(ctx context.Context, t ioTarget, rep int) (Measurement, error) {
				if err := dropCaches(); err != nil {
					return Measurement{}, err
				}
				return seqRead(ctx, t, rep)
			},
			note: "page, dentry and inode caches dropped (echo 3 > /proc/sys/vm/drop_caches) before each read",
		})
	} else {
		e.Add(Row{Name: "cold sequential read", Verdict: VerdictSkip, Note: "needs root to drop caches"})
	}
	tests = append(tests,
		ioTest{
			name: fmt.Sprintf("warm sequential read of %s", fmtSize(size)), unit: "MiB/s", scale: mib, reps: e.Size(40, 20),
			prepare: warm, run: seqRead, targets: []Target{RatioAtLeast(0.9)},
			note: "1 MiB read(2)s of a file in the page cache",
		},
		ioTest{
			name: "random 4 KiB reads, warm", unit: "reads/s", scale: 1, reps: e.Size(15, 10), prepare: warm,
			run: func(ctx context.Context, t ioTarget, rep int) (Measurement, error) {
				rng := rand.New(rand.NewPCG(uint64(rep), 99))
				fd, err := openRead(t.big)
				if err != nil {
					return Measurement{}, err
				}
				defer unix.Close(fd)
				pages := size / 4096
				return Timed(float64(randomReads), func() error {
					for range randomReads {
						if _, err := unix.Pread(fd, buf[:4096], rng.Int64N(pages)*4096); err != nil {
							return err
						}
					}
					return nil
				})
			},
			note: "pread(2) at random 4 KiB-aligned offsets of the big file, in the page cache",
		},
		ioTest{
			name: fmt.Sprintf("large write of %s + fsync", fmtSize(size)), unit: "MiB/s", scale: mib, reps: 3, writes: true,
			run: func(ctx context.Context, t ioTarget, rep int) (Measurement, error) {
				p := filepath.Join(t.scratch, fmt.Sprintf("write-%d", rep))
				m, err := Timed(float64(size), func() error { return writeFsync(p, size, wbuf, uint64(rep)) })
				os.Remove(p)
				return m, err
			},
		},
		ioTest{
			name: fmt.Sprintf("create %s files of 1 KiB", fmtCount(creates)), unit: "files/s", scale: 1, reps: 3, writes: true,
			run: func(ctx context.Context, t ioTarget, rep int) (Measurement, error) {
				dir := filepath.Join(t.scratch, fmt.Sprintf("create-%d", rep))
				if err := os.Mkdir(dir, 0o755); err != nil {
					return Measurement{}, err
				}
				m, err := Timed(float64(creates), func() error {
					for i := range creates {
						if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), wbuf[:1024], 0o644); err != nil {
							return err
						}
					}
					return nil
				})
				return m, errors.Join(err, removeAll(dir))
			},
			note: "open(O_CREAT)+write+close each, no fsync, in a new directory",
		},
		ioTest{
			name: fmt.Sprintf("warm stat of %s files", fmtCount(n)), unit: "ms", latency: true, reps: e.Size(15, 9),
			prepare: func(t ioTarget) error { return statAll(t.tree, paths) },
			run: func(ctx context.Context, t ioTarget, _ int) (Measurement, error) {
				return Timed(float64(n), func() error { return statAll(t.tree, paths) })
			},
			targets: []Target{RatioAtMost(1.5)},
			note:    "lstat(2) of every file by its path relative to the tree (fstatat on the tree's fd), after one warm-up pass; go-fuse loopback has its stock 1 s attribute timeout",
		},
		ioTest{
			name: fmt.Sprintf("git-status-like walk of %s files", fmtCount(n)), unit: "ms", latency: true, reps: e.Size(5, 3),
			prepare: func(t ioTarget) error { _, err := statWalk(t.tree); return err },
			run: func(ctx context.Context, t ioTarget, _ int) (Measurement, error) {
				return Timed(float64(n), func() error {
					got, err := statWalk(t.tree)
					if err == nil && got < n {
						err = fmt.Errorf("walk of %s saw %d entries, want ≥ %d", t.tree, got, n)
					}
					return err
				})
			},
			targets: []Target{RatioAtMost(1.5)},
			note:    "readdir of every directory and lstat of every entry, warm",
		},
	)

	for _, test := range tests {
		var subjects []Subject
		var used []ioTarget
		for _, t := range ts {
			if test.writes && t.scratch == "" {
				continue
			}
			if test.prepare != nil {
				if err := test.prepare(t); err != nil {
					return fmt.Errorf("%s: prepare %s: %w", test.name, t.name, err)
				}
			}
			rep := 0
			subjects = append(subjects, func(ctx context.Context) (Measurement, error) {
				rep++
				return test.run(ctx, t, rep)
			})
			used = append(used, t)
		}
		e.Logf("  %s", test.name)
		ms, err := Interleave(ctx, test.reps, subjects...)
		if err != nil {
			return fmt.Errorf("%s: %w", test.name, err)
		}
		summary := func(i int) Sample {
			if test.latency {
				return Latencies(ms[i])
			}
			return Rates(ms[i], test.scale)
		}
		base := summary(0) // native is first
		for i, t := range used {
			s := summary(i)
			row := Row{Name: test.name + ": " + t.name, Value: s.P50, Unit: test.unit, P90: s.P90, N: s.N, Samples: s.Values, Path: "fs"}
			if i > 0 {
				row.Baseline, row.BaselineValue = native, base.P50
			} else {
				row.Note = test.note
			}
			if t.esf {
				row.Targets = test.targets
			}
			e.Add(row)
		}
	}
	return nil
}

// statAll lstat()s every p relative to dir, as a tool working inside a
// tree does (git, find, make run there): the cost does not depend on how
// deep dir itself lies, which differs between the targets (an attempt root
// is three components deeper than the native tree).
func statAll(dir string, paths []string) error {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	for _, p := range paths {
		for {
			err = unix.Fstatat(fd, p, &st, unix.AT_SYMLINK_NOFOLLOW)
			if err != unix.EINTR { // see lstat
				break
			}
		}
		if err != nil {
			return &fs.PathError{Op: "lstat", Path: dir + "/" + p, Err: err}
		}
	}
	return nil
}

// lstat is unix.Lstat retried on EINTR, as package os does: a FUSE request
// still queued when the calling thread gets a signal (the Go runtime's
// preemption signal, say) fails with EINTR.
func lstat(p string, st *unix.Stat_t) error {
	for {
		if err := unix.Lstat(p, st); err != unix.EINTR {
			return err
		}
	}
}
