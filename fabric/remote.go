package fabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/gc"
)

// RemoteFsckResult is the result of FsckRemote: Checked, Bytes and Bad as
// for Fsck, over the remote copies of every reachable object, and Missing,
// the reachable objects the remote does not have.
type RemoteFsckResult struct {
	cas.FsckResult
	Missing []cas.ID `json:"missing,omitempty"`
}

// FsckRemote checks that every object the graph reaches (the roots and
// evidence GC keeps) is in the remote content store and whole: it reads
// each remote copy to its end through the verifying reader. Trees are
// walked through the cache (fetching what it lacks). Without a remote it
// fails with errdefs.ErrFailedPrecondition.
func (f *Fabric) FsckRemote(ctx context.Context) (RemoteFsckResult, error) {
	var res RemoteFsckResult
	if f.tier == nil {
		return res, fmt.Errorf("fsck --remote: no remote content store (esfd --cas-remote): %w", errdefs.ErrFailedPrecondition)
	}
	roots, extra, err := f.liveRoots(ctx)
	if err != nil {
		return res, fmt.Errorf("fsck --remote: %w", err)
	}
	seen := map[cas.ID]bool{}
	var ids []cas.ID
	if err := gc.Mark(ctx, f.store, roots, extra, func(id cas.ID) {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}); err != nil {
		return res, fmt.Errorf("fsck --remote: %w", err)
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	remote := f.opts.Remote
	for _, id := range ids {
		g.Go(func() error {
			n, err := readRemote(gctx, remote, id)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				res.Checked++
				res.Bytes += n
			case errors.Is(err, cas.ErrNotFound):
				res.Missing = append(res.Missing, id)
				f.log.Error("fsck --remote: missing", "id", id)
			case errors.Is(err, cas.ErrCorrupt):
				res.Checked++
				res.Bad = append(res.Bad, id)
				f.log.Error("fsck --remote: corrupt", "id", id, "err", err)
			default:
				return err
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return res, fmt.Errorf("fsck --remote: %w", err)
	}
	cmp := func(a, b cas.ID) int { return slices.Compare(a[:], b[:]) }
	slices.SortFunc(res.Bad, cmp)
	slices.SortFunc(res.Missing, cmp)
	f.log.Info("fsck --remote done", "reachable", len(ids), "checked", res.Checked, "bytes", res.Bytes,
		"bad", len(res.Bad), "missing", len(res.Missing))
	return res, nil
}

func readRemote(ctx context.Context, g cas.Getter, id cas.ID) (int64, error) {
	rc, err := g.Get(ctx, id)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}
