package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	v1 "github.com/esf-dev/esf/api/v1"
	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/cas/local"
	"github.com/esf-dev/esf/fabric"
)

// The parts activate and seal are made of, measured alone in the same run,
// so that the rows above can be explained: a journal commit, a small CAS
// batch (the objects of a one-file seal), an overlay mount and unmount on
// the projection, and what the API adds to a fork.

func init() {
	Register(Scenario{Name: "breakdown", Order: 55, Run: benchBreakdown})
}

func benchBreakdown(ctx context.Context, e *Env) error {
	d, err := e.Main(ctx)
	if err != nil {
		return err
	}
	tree, err := e.Tree(ctx, 100)
	if err != nil {
		return err
	}
	g, err := e.Group(ctx, tree)
	if err != nil {
		return err
	}
	// One activation makes sure the projection serves.
	kids, err := d.Ops.Fork(ctx, g.Node.NodeID, 1)
	if err != nil {
		return err
	}
	aid, _, err := d.Ops.Activate(ctx, kids[0])
	if err != nil {
		return err
	}
	if err := d.Ops.Release(ctx, aid); err != nil {
		return err
	}
	lower := filepath.Join(d.StateDir, "mnt", "roots", g.Node.RootID)

	fsync, err := e.fdatasyncSubject()
	if err != nil {
		return err
	}
	forkAPI := func(ctx context.Context) (Measurement, error) {
		return Timed(1, func() error {
			_, err := d.Client.Fork(ctx, v1.ForkRequest{NodeID: g.Node.NodeID, N: 1}, apiOpts)
			return err
		})
	}
	forkFabric := func(ctx context.Context) (Measurement, error) {
		return Timed(1, func() error {
			_, err := d.Fabric.Fork(ctx, fabric.ForkRequest{NodeID: g.Node.NodeID, N: 1})
			return err
		})
	}
	status := func(ctx context.Context) (Measurement, error) {
		return Timed(1, func() error { _, err := d.Client.Status(ctx); return err })
	}
	// Four new small objects: the blob and three trees of a one-file seal.
	seq := uint64(0)
	objects := func() [][]byte {
		seq++
		out := make([][]byte, 4)
		for i := range out {
			b := make([]byte, 4096)
			stamp(b, int64(i), seq)
			out[i] = b
		}
		return out
	}
	// The same batch in a store that flushes small batches file by file
	// (local.Options.SmallBatch) instead of with its redo log.
	smallDir, err := e.Mkdir("cas-file-by-file")
	if err != nil {
		return err
	}
	smallStore, err := local.Open(smallDir, &local.Options{SmallBatch: 16})
	if err != nil {
		return err
	}
	batchIn := func(st cas.Store) Subject {
		return func(ctx context.Context) (Measurement, error) {
			objs := objects()
			return Timed(1, func() error {
				b := cas.NewBatch(st)
				defer b.Abort()
				for _, o := range objs {
					if _, _, err := b.Put(ctx, bytes.NewReader(o)); err != nil {
						return err
					}
				}
				return b.Commit(ctx)
			})
		}
	}
	batch := batchIn(d.Fabric.Store())
	puts := func(ctx context.Context) (Measurement, error) {
		objs := objects()
		return Timed(1, func() error {
			for _, o := range objs {
				if _, _, err := d.Fabric.Store().Put(ctx, bytes.NewReader(o)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	umount := func(volatile bool) Subject {
		return func(ctx context.Context) (Measurement, error) {
			dir, err := e.Mkdir("umount")
			if err != nil {
				return Measurement{}, err
			}
			upper, work, mnt := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "mnt")
			for _, d := range []string{upper, work, mnt} {
				if err := os.Mkdir(d, 0o755); err != nil {
					return Measurement{}, err
				}
			}
			opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + "," + strings.TrimSuffix(overlayOpts, ",volatile")
			if volatile {
				opts += ",volatile"
			}
			if err := unix.Mount("overlay", mnt, "overlay", 0, opts); err != nil {
				return Measurement{}, err
			}
			if err := os.WriteFile(filepath.Join(mnt, "new.txt"), make([]byte, 4096), 0o644); err != nil {
				unix.Unmount(mnt, 0)
				return Measurement{}, err
			}
			return Timed(1, func() error { return unix.Unmount(mnt, 0) })
		}
	}
	subjects := []Subject{fsync, forkAPI, forkFabric, batch, puts, umount(false), umount(true), status, batchIn(smallStore)}
	if _, err := Interleave(ctx, 5, subjects...); err != nil {
		return err
	}
	ms, err := Interleave(ctx, e.Size(30, 60), subjects...)
	if err != nil {
		return err
	}
	s := make([]Sample, len(ms))
	for i := range ms {
		s[i] = Latencies(ms[i])
	}
	e.Add(Row{Name: "part: fork via the API", Value: s[1].P50, Unit: "ms", P90: s[1].P90, N: s[1].N, Samples: s[1].Values,
		Baseline: "fork as a Fabric method", BaselineValue: s[2].P50, Path: "api",
		Note: "the difference is the HTTP round trip and JSON over the unix socket"})
	e.Add(Row{Name: "part: API round trip (GET /v1/status)", Value: s[7].P50, Unit: "ms", P90: s[7].P90, N: s[7].N, Samples: s[7].Values, Path: "api",
		Note: "a client.Client call that does no work in the daemon: HTTP over the unix socket, JSON, the server's request plumbing"})
	e.Add(Row{Name: "part: journal commit (fork as a Fabric method)", Value: s[2].P50, Unit: "ms", P90: s[2].P90, N: s[2].N, Samples: s[2].Values,
		Baseline: "fdatasync", BaselineValue: s[0].P50, Path: "fabric",
		Note: "one pebble batch committed with Sync: a WAL write and an fdatasync"})
	e.Add(Row{Name: "part: CAS batch of 4 new 4 KiB objects", Value: s[3].P50, Unit: "ms", P90: s[3].P90, N: s[3].N, Samples: s[3].Values,
		Baseline: "4 Puts", BaselineValue: s[4].P50, Path: "fabric",
		Note: "the objects of a one-file seal as the store alone commits them (a seal with the pebble journal has its journal commit carry them instead): a batch this small is made durable by one fdatasync of the store's redo log (a larger one by a syncfs(2), which also writes back every other dirty page of the file system); a Put fsyncs its file and directory"})
	e.Add(Row{Name: "part: CAS batch of 4 new 4 KiB objects, file by file", Value: s[8].P50, Unit: "ms", P90: s[8].P90, N: s[8].N, Samples: s[8].Values,
		Baseline: "with the redo log (the default)", BaselineValue: s[3].P50, Path: "fabric",
		Note: "local.Options{SmallBatch: 16}: fsync of each temp file, then of each fan-out directory, in parallel; immune to other writers' dirty pages, but every fsync ends with its own flush of the device cache"})
	e.Add(Row{Name: "part: umount overlay on the projection after a 4 KiB write", Value: s[5].P50, Unit: "ms", P90: s[5].P90, N: s[5].N, Samples: s[5].Values,
		Baseline: "same, mounted volatile", BaselineValue: s[6].P50, Path: "fs",
		Note: "unmounting an overlay syncs its upper file system (the state dir's, shared with everything else) unless it is mounted volatile"})
	return nil
}
