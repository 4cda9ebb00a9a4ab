package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/fabric"
)

// Attempts: activate, rollback (activate an ancestor), release, and seal
// against the size of the root and of the delta.

func init() {
	Register(Scenario{Name: "activate", Order: 40, Run: benchActivate})
	Register(Scenario{Name: "seal", Order: 50, Run: benchSeal})
}

// overlayOpts are the overlay features esf's attempts mount with (see
// delta.Options, volatile included); the plain-overlayfs baselines use the
// same, so that only the lower layer differs.
const overlayOpts = delta.Options

// mountOverlay mounts an overlay of lower at a fresh directory under dir
// and returns the mount point.
func mountOverlay(lower, dir string) (string, error) {
	upper, work, mnt := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "mnt")
	for _, d := range []string{upper, work, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + "," + overlayOpts
	if err := unix.Mount("overlay", mnt, "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("mount overlay of %s: %w", lower, err)
	}
	return mnt, nil
}

// sealChain seals depth one-file changes on top of node and returns the
// last sealed node.
func sealChain(ctx context.Context, d *Daemon, node string, depth int) (string, error) {
	for i := range depth {
		kids, err := d.Ops.Fork(ctx, node, 1)
		if err != nil {
			return "", err
		}
		aid, root, err := d.Ops.Activate(ctx, kids[0])
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("chain-%d.txt", i)), []byte("step\n"), 0o644); err != nil {
			return "", err
		}
		if node, err = d.Ops.Suspend(ctx, aid); err != nil {
			return "", err
		}
	}
	return node, nil
}

func benchActivate(ctx context.Context, e *Env) error {
	n := e.LargeTree()
	tree, err := e.Tree(ctx, n)
	if err != nil {
		return err
	}
	g, err := e.Group(ctx, tree)
	if err != nil {
		return err
	}
	d, err := e.Main(ctx)
	if err != nil {
		return err
	}
	const depth = 3
	leaf, err := sealChain(ctx, d, g.Node.NodeID, depth)
	if err != nil {
		return err
	}
	lower := filepath.Join(d.StateDir, "mnt", "roots", g.Node.RootID)
	var releases, umounts []Measurement
	activate := func(node func(context.Context) (string, error)) Subject {
		return func(ctx context.Context) (Measurement, error) {
			id, err := node(ctx)
			if err != nil {
				return Measurement{}, err
			}
			var aid string
			m, err := Timed(1, func() error {
				var err error
				aid, _, err = d.Ops.Activate(ctx, id)
				return err
			})
			if err != nil {
				return m, err
			}
			r, err := Timed(1, func() error { return d.Ops.Release(ctx, aid) })
			releases = append(releases, r)
			return m, err
		}
	}
	draft := func(ctx context.Context) (string, error) {
		kids, err := d.Ops.Fork(ctx, leaf, 1)
		if err != nil {
			return "", err
		}
		return kids[0], nil
	}
	ancestor := func(context.Context) (string, error) { return g.Node.NodeID, nil }
	overlay := func(ctx context.Context) (Measurement, error) {
		dir, err := e.Mkdir("ovl")
		if err != nil {
			return Measurement{}, err
		}
		upper, work, mnt := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "mnt")
		for _, d := range []string{upper, work, mnt} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return Measurement{}, err
			}
		}
		opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + "," + overlayOpts
		m, err := Timed(1, func() error { return unix.Mount("overlay", mnt, "overlay", 0, opts) })
		if err != nil {
			return m, err
		}
		u, err := Timed(1, func() error { return unix.Unmount(mnt, 0) })
		umounts = append(umounts, u)
		return m, err
	}
	subjects := []Subject{overlay, activate(draft), activate(ancestor)}
	if _, err := Interleave(ctx, 5, subjects...); err != nil {
		return err
	}
	releases, umounts = nil, nil
	ms, err := Interleave(ctx, e.Size(30, 60), subjects...)
	if err != nil {
		return err
	}
	ov, ad, aa := Latencies(ms[0]), Latencies(ms[1]), Latencies(ms[2])
	rel, um := Latencies(releases), Latencies(umounts)
	path := d.Ops.Path("activate")
	e.Add(Row{Name: fmt.Sprintf("activate a draft (root of %s files)", fmtCount(n)), Value: ad.P50, Unit: "ms", P90: ad.P90, N: ad.N, Samples: ad.Values,
		Baseline: "mount(2) overlayfs on the projection", BaselineValue: ov.P50, Targets: []Target{AtMost(2)}, Path: path,
		Note: "executor none: one journal commit (attempt, lease, runtime record) with the overlay mount on the FUSE projection (a child process) made while it flushes"})
	e.Add(Row{Name: fmt.Sprintf("rollback: activate an ancestor %d seals up", depth), Value: aa.P50, Unit: "ms", P90: aa.P90, N: aa.N, Samples: aa.Values,
		Baseline: "activate a draft", BaselineValue: ad.P50, Targets: []Target{AtMost(2)}, Path: path})
	e.Add(Row{Name: "release an attempt", Value: rel.P50, Unit: "ms", P90: rel.P90, N: rel.N, Samples: rel.Values,
		Baseline: "umount(2) overlayfs", BaselineValue: um.P50, Path: d.Ops.Path("release"),
		Note: "unmount (volatile: no sync) and one journal commit; the delta is deleted after the reply"})
	return nil
}

func benchSeal(ctx context.Context, e *Env) error {
	d, err := e.Main(ctx)
	if err != nil {
		return err
	}
	n := e.LargeTree()
	sizes := []int{100, n}
	groups := make([]string, len(sizes))
	for i, k := range sizes {
		dir, err := e.Tree(ctx, k)
		if err != nil {
			return err
		}
		g, err := e.Group(ctx, dir)
		if err != nil {
			return err
		}
		groups[i] = g.Node.NodeID
	}
	// attempt forks node and activates the draft: untimed setup.
	attempt := func(ctx context.Context, node string) (aid, root string, err error) {
		kids, err := d.Ops.Fork(ctx, node, 1)
		if err != nil {
			return "", "", err
		}
		return d.Ops.Activate(ctx, kids[0])
	}
	rep := uint64(0)
	page := randomBuffer(11)[:4096]
	viaAPI := func(ctx context.Context, aid string) error { _, err := d.Ops.Suspend(ctx, aid); return err }
	// The same seal as a Fabric method, in this process: what the API adds.
	viaFabric := func(ctx context.Context, aid string) error {
		_, err := d.Fabric.Suspend(ctx, fabric.SuspendRequest{AttemptID: aid})
		return err
	}
	// cpu[k]: the CPU time (user and system) of this process, which is the
	// daemon too, during each timed seal of sealWith(..., k): ms.
	cpu := make([][]float64, 2)
	sealWith := func(node string, suspend func(context.Context, string) error, k int) Subject {
		return func(ctx context.Context) (Measurement, error) {
			aid, root, err := attempt(ctx, node)
			if err != nil {
				return Measurement{}, err
			}
			rep++
			stamp(page, 0, rep)
			// Overwrite one existing file three directories deep.
			if err := os.WriteFile(filepath.Join(root, treePath(0)), page, 0o644); err != nil {
				return Measurement{}, err
			}
			cpu0 := processCPU()
			m, err := Timed(1, func() error { return suspend(ctx, aid) })
			if k >= 0 {
				cpu[k] = append(cpu[k], float64(processCPU()-cpu0)/float64(time.Millisecond))
			}
			return m, err
		}
	}
	sealOne := func(node string) Subject { return sealWith(node, viaAPI, -1) }
	// The same seal with --keep-running: no unmount, no delta deletion.
	checkpoint := func(ctx context.Context) (Measurement, error) {
		aid, root, err := attempt(ctx, groups[1])
		if err != nil {
			return Measurement{}, err
		}
		rep++
		stamp(page, 0, rep)
		if err := os.WriteFile(filepath.Join(root, treePath(0)), page, 0o644); err != nil {
			return Measurement{}, err
		}
		m, err := Timed(1, func() error { _, err := d.Ops.Checkpoint(ctx, aid); return err })
		return m, errors.Join(err, d.Ops.Release(ctx, aid))
	}
	fsync, err := e.fdatasyncSubject()
	if err != nil {
		return err
	}
	subjects := []Subject{fsync, sealWith(groups[0], viaAPI, 0), sealOne(groups[1]), checkpoint, sealWith(groups[0], viaFabric, 1)}
	if _, err := Interleave(ctx, 3, subjects...); err != nil {
		return err
	}
	cpu[0], cpu[1] = nil, nil // the warm-up's
	ms, err := Interleave(ctx, e.Size(15, 30), subjects...)
	if err != nil {
		return err
	}
	fs, s100, sN, kr, sf := Latencies(ms[0]), Latencies(ms[1]), Latencies(ms[2]), Latencies(ms[3]), Latencies(ms[4])
	capi, cfab := Summarize(cpu[0]), Summarize(cpu[1])
	path := d.Ops.Path("suspend")
	e.Add(Row{Name: "seal one 4 KiB change, root of 100 files", Value: s100.P50, Unit: "ms", P90: s100.P90, N: s100.N, Samples: s100.Values,
		Baseline: "fdatasync", BaselineValue: fs.P50, Targets: []Target{AtMost(5), RatioAtMost(3)}, Path: path,
		Note: "suspend with no executor, release included (what esfctl suspend waits for): one flush: the new objects' bytes ride in the seal's journal commit (one fdatasync of pebble's WAL), and are linked into the store unflushed (fabric/storeredo.go); the file is p000/d00/f00.txt, three trees deep"})
	e.Add(Row{Name: fmt.Sprintf("seal one 4 KiB change, root of %s files", fmtCount(n)), Value: sN.P50, Unit: "ms", P90: sN.P90, N: sN.N, Samples: sN.Values,
		Baseline: "seal, root of 100 files", BaselineValue: s100.P50, Targets: []Target{AtMost(5), RatioAtMost(1.5)}, Path: path})
	e.Add(Row{Name: fmt.Sprintf("seal --keep-running, root of %s files", fmtCount(n)), Value: kr.P50, Unit: "ms", P90: kr.P90, N: kr.N, Samples: kr.Values,
		Baseline: "seal (with release)", BaselineValue: sN.P50, Path: path,
		Note: "the same one-file seal leaving the attempt active: no unmount, no deletion of the delta"})
	e.Add(Row{Name: "part: seal one 4 KiB change as a Fabric method, root of 100 files", Value: sf.P50, Unit: "ms", P90: sf.P90, N: sf.N, Samples: sf.Values,
		Baseline: "seal, root of 100 files (API)", BaselineValue: s100.P50, Path: "fabric",
		Note: "the same seal without the HTTP and JSON layers (fabric.Fabric.Suspend in the bench's process); fabric's BenchmarkSealOne is this row under go test -cpuprofile"})
	e.Add(Row{Name: "part: CPU time per seal through the API, root of 100 files", Value: capi.P50, Unit: "ms", P90: capi.P90, N: capi.N, Samples: capi.Values,
		Baseline: "seal, root of 100 files (API)", BaselineValue: s100.P50, Path: path,
		Note: "user + system time of this process (client and daemon) during one seal: the rest of the seal's time is waiting (the one fdatasync, the umount, the run queue)"})
	e.Add(Row{Name: "part: CPU time per seal as a Fabric method, root of 100 files", Value: cfab.P50, Unit: "ms", P90: cfab.P90, N: cfab.N, Samples: cfab.Values,
		Baseline: "seal as a Fabric method", BaselineValue: sf.P50, Path: "fabric",
		Note: "user + system time of this process during one fabric.Fabric.Suspend"})

	// Deltas of 1k files and of one big file, in the large root.
	const deltaFiles = 1000
	buf := randomBuffer(13)
	writeFiles := func(dir string, seed uint64) error {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for i := range deltaFiles {
			stamp(buf, int64(i), seed)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), buf[:4096], 0o644); err != nil {
				return err
			}
		}
		return syncfs(dir)
	}
	seed := uint64(1000)
	sealFiles := func(ctx context.Context) (Measurement, error) {
		aid, root, err := attempt(ctx, groups[1])
		if err != nil {
			return Measurement{}, err
		}
		seed++
		if err := writeFiles(filepath.Join(root, "delta"), seed); err != nil {
			return Measurement{}, err
		}
		return Timed(deltaFiles, func() error { _, err := d.Ops.Suspend(ctx, aid); return err })
	}
	cpFiles := func(ctx context.Context) (Measurement, error) {
		dir, err := e.Mkdir("delta")
		if err != nil {
			return Measurement{}, err
		}
		seed++
		if err := writeFiles(filepath.Join(dir, "src"), seed); err != nil {
			return Measurement{}, err
		}
		m, err := Timed(deltaFiles, func() error {
			if err := run(ctx, "cp", "-a", filepath.Join(dir, "src"), filepath.Join(dir, "dst")); err != nil {
				return err
			}
			return syncfs(dir)
		})
		return m, errors.Join(err, removeAll(dir))
	}
	size := e.BigSize()
	sealBig := func(ctx context.Context) (Measurement, error) {
		aid, root, err := attempt(ctx, groups[1])
		if err != nil {
			return Measurement{}, err
		}
		seed++
		if err := writeFsync(filepath.Join(root, "big.bin"), size, buf, seed); err != nil {
			return Measurement{}, err
		}
		return Timed(float64(size), func() error { _, err := d.Ops.Suspend(ctx, aid); return err })
	}
	writeBig := func(ctx context.Context) (Measurement, error) {
		dir, err := e.Mkdir("delta-big")
		if err != nil {
			return Measurement{}, err
		}
		seed++
		p := filepath.Join(dir, "big.bin")
		m, err := Timed(float64(size), func() error { return writeFsync(p, size, buf, seed) })
		os.Remove(p)
		return m, err
	}
	ms, err = Interleave(ctx, e.Size(3, 5), sealFiles, cpFiles, sealBig, writeBig)
	if err != nil {
		return err
	}
	sf, cf := Rates(ms[0], 1), Rates(ms[1], 1)
	sb, wb := Rates(ms[2], mib), Rates(ms[3], mib)
	e.Add(Row{Name: fmt.Sprintf("seal a delta of %s new 4 KiB files", fmtCount(deltaFiles)), Value: sf.P50, Unit: "files/s", P90: sf.P90, N: sf.N, Samples: sf.Values,
		Baseline: "cp -a + syncfs", BaselineValue: cf.P50, Path: path,
		Note: fmt.Sprintf("in a root of %s files; the delta was synced before the seal", fmtCount(n))})
	e.Add(Row{Name: fmt.Sprintf("seal a delta of one %s file", fmtSize(size)), Value: sb.P50, Unit: "MiB/s", P90: sb.P90, N: sb.N, Samples: sb.Values,
		Baseline: "write + fsync", BaselineValue: wb.P50, Targets: []Target{RatioAtLeast(0.8)}, Path: path,
		Note: "the attempt is released with the seal: the file's inode becomes its object (read once, to hash it; no copy) and one syncfs makes it durable"})
	return nil
}
