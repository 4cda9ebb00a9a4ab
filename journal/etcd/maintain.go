package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// markerRetention is how long outcome markers are kept: far longer than
// any commit's reply can take to be resolved.
const markerRetention = 10 * time.Minute

// maintainLoop runs Maintain every CompactEvery.
func (s *Store) maintainLoop(ctx context.Context) {
	t := time.NewTicker(s.opts.CompactEvery)
	defer t.Stop()
	var prev int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur, err := s.maintain(ctx, prev)
		if err != nil && ctx.Err() == nil {
			s.opts.Logger.Warn("etcd journal: maintenance", "err", err)
		}
		if cur > 0 {
			prev = cur
		}
	}
}

// Maintain does one round of the periodic maintenance now: it compacts
// etcd's history up to revision upTo (0: none), clears the tombstones,
// deletes staged writes of transactions that were never published and are
// older than upTo, and deletes outcome markers older than ten minutes. It
// returns the current revision, the next round's upTo. Several clients of
// one cluster may run it at once.
func (s *Store) Maintain(ctx context.Context, upTo int64) (int64, error) {
	exit, err := s.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer exit()
	return s.maintain(ctx, upTo)
}

func (s *Store) maintain(ctx context.Context, upTo int64) (int64, error) {
	k := s.k
	resp, err := s.cli.Get(ctx, k.tombGC(), clientv3.WithCountOnly())
	if err != nil {
		return 0, s.mapErr(ctx, err)
	}
	cur := resp.Header.Revision
	var errs []error
	if upTo > 0 && !s.noCompact.Load() {
		_, err := s.cli.Compact(ctx, upTo)
		switch {
		case errors.Is(err, rpctypes.ErrPermissionDenied):
			// Compaction is the root role's: with a user of less, the
			// cluster compacts itself (--auto-compaction-retention).
			s.noCompact.Store(true)
			s.opts.Logger.Warn("etcd journal: the user may not compact; run etcd with --auto-compaction-mode=periodic --auto-compaction-retention=5m")
		case err != nil && !errors.Is(err, rpctypes.ErrCompacted):
			errs = append(errs, fmt.Errorf("compact to %d: %w", upTo, s.mapErr(ctx, err)))
		}
	}
	// Tombstones: every transaction that scanned compares tombgc, so
	// clearing them all at once cannot hide a deletion from one.
	n, err := s.cli.Get(ctx, k.tomb(""), clientv3.WithRange(k.tombEnd()), clientv3.WithCountOnly())
	if err == nil && n.Count > 0 {
		_, err = s.cli.Txn(ctx).Then(
			clientv3.OpDelete(k.tomb(""), clientv3.WithRange(k.tombEnd())),
			clientv3.OpPut(k.tombGC(), ""),
		).Commit()
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("clear tombstones: %w", s.mapErr(ctx, err)))
	}
	if err := s.clearStages(ctx, upTo); err != nil {
		errs = append(errs, err)
	}
	old := fmt.Sprintf("%012d", bucketOf(time.Now().Add(-markerRetention)))
	if _, err := s.cli.Txn(ctx).Then(
		clientv3.OpDelete(k.donePrefix(), clientv3.WithRange(k.donePrefix()+old)),
		clientv3.OpDelete(k.abortPrefix(), clientv3.WithRange(k.abortPrefix()+old)),
	).Commit(); err != nil {
		errs = append(errs, fmt.Errorf("clear outcome markers: %w", s.mapErr(ctx, err)))
	}
	s.kickIndexer()
	return cur, errors.Join(errs...)
}

// clearStages deletes the staged writes of transactions created before
// revision before (or at it) that were never published: their writers gave up or
// died. A writer still going compares its first chunk at publishing, so
// it cannot publish a transaction whose chunks were deleted.
func (s *Store) clearStages(ctx context.Context, before int64) error {
	if before <= 0 {
		return nil
	}
	k := s.k
	resp, err := s.cli.Get(ctx, k.stageRoot(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("list staged writes: %w", s.mapErr(ctx, err))
	}
	seen := map[string]bool{}
	for _, kv := range resp.Kvs {
		rest := string(kv.Key[len(k.stageRoot()):])
		txid := rest
		for i := 0; i < len(rest); i++ {
			if rest[i] == '/' {
				txid = rest[:i]
				break
			}
		}
		if seen[txid] || kv.CreateRevision > before {
			continue
		}
		seen[txid] = true
		if _, err := s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Version(k.commit(txid)), "=", 0)).
			Then(clientv3.OpDelete(k.stagePrefix(txid), clientv3.WithPrefix())).Commit(); err != nil {
			return fmt.Errorf("delete staged writes of %s: %w", txid, s.mapErr(ctx, err))
		}
	}
	return nil
}
