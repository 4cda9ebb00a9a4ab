package bench

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/fabric"
)

// Copy-up of a sparse file (issue 16): the first write to a large lower
// file copies it to the upper directory whole, and how much of it lands on
// disk depends on the lower layer answering SEEK_DATA with its holes.

func init() {
	Register(Scenario{Name: "sparse", Order: 45, Run: benchSparseCopyUp})
}

// sparseSize is the sparse file's size; 4 KiB of it is data, at the start.
const sparseSize = 100 << 20

func benchSparseCopyUp(ctx context.Context, e *Env) error {
	src, err := e.Mkdir("sparse-src")
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(src, "disk.img"))
	if err != nil {
		return err
	}
	_, err = f.Write(randomBuffer(23)[:4096])
	err = errors.Join(err, f.Truncate(sparseSize), f.Close())
	if err != nil {
		return err
	}
	d, err := e.Main(ctx)
	if err != nil {
		return err
	}
	g, err := e.Group(ctx, src)
	if err != nil {
		return err
	}
	appendByte := func(root string) error {
		f, err := os.OpenFile(filepath.Join(root, "disk.img"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		_, err = f.Write([]byte{1})
		return errors.Join(err, f.Close())
	}
	// Each subject's Work is the upper directory's allocated bytes after
	// the copy-up; Elapsed is the append that triggered it.
	esf := func(ctx context.Context) (Measurement, error) {
		kids, err := d.Ops.Fork(ctx, g.Node.NodeID, 1)
		if err != nil {
			return Measurement{}, err
		}
		aid, root, err := d.Ops.Activate(ctx, kids[0])
		if err != nil {
			return Measurement{}, err
		}
		m, err := Timed(0, func() error { return appendByte(root) })
		if err == nil {
			var in fabric.Inspection
			if in, err = d.Fabric.Inspect(ctx, aid); err == nil {
				m.Work, err = allocated(filepath.Join(in.Attempt.Runtime.PrivateDelta, "upper"))
			}
		}
		return m, errors.Join(err, d.Ops.Release(ctx, aid))
	}
	plain := func(ctx context.Context) (Measurement, error) {
		dir, err := e.Mkdir("sparse-overlay")
		if err != nil {
			return Measurement{}, err
		}
		mnt, err := mountOverlay(src, dir)
		if err != nil {
			return Measurement{}, err
		}
		m, err := Timed(0, func() error { return appendByte(mnt) })
		if err == nil {
			m.Work, err = allocated(filepath.Join(dir, "upper"))
		}
		return m, errors.Join(err, unix.Unmount(mnt, 0))
	}
	ms, err := Interleave(ctx, e.Size(3, 5), esf, plain)
	if err != nil {
		return err
	}
	work := func(ms []Measurement) Sample {
		xs := make([]float64, len(ms))
		for i, m := range ms {
			xs[i] = m.Work / mib
		}
		return Summarize(xs)
	}
	s, b := work(ms[0]), work(ms[1])
	e.Add(Row{Name: "copy-up of a 100 MiB sparse file, +1 byte: upper-dir bytes", Value: s.P50, Unit: "MiB", P90: s.P90, N: s.N,
		Baseline: "plain overlayfs on ext4", BaselineValue: b.P50, Targets: []Target{RatioAtMost(1.1)}, Path: "fs",
		Note: "4 KiB of data at the start, a hole to 100 MiB; overlayfs copies up in 1 MiB chunks and skips what SEEK_DATA calls a hole"})
	ls, lb := Latencies(ms[0]), Latencies(ms[1])
	e.Add(Row{Name: "copy-up of a 100 MiB sparse file, +1 byte: the append", Value: ls.P50, Unit: "ms", P90: ls.P90, N: ls.N,
		Baseline: "plain overlayfs on ext4", BaselineValue: lb.P50, Path: "fs",
		Note: "the first open of the blob in the projection server verifies it (100 MiB hashed once per process)"})
	return nil
}

// allocated sums the disk space (st_blocks) of everything under dir.
func allocated(dir string) (float64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		n += st.Blocks * 512
		return nil
	})
	return float64(n), err
}
