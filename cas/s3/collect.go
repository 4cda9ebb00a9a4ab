package s3

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/esf-dev/esf/cas"
)

// CollectOptions configures Collect.
type CollectOptions struct {
	// Live reports the objects to keep (the marked ones). Required.
	Live func(cas.ID) bool
	// Guard runs a deletion of ids atomically with respect to writers (the
	// GC tracker's per-id locks): fn gets keep, which reports the ids a
	// writer recorded since the mark, and must not delete those. Nil runs
	// fn directly with a keep that keeps nothing.
	Guard func(ids []cas.ID, fn func(keep func(cas.ID) bool) error) error
	// Grace keeps every key modified less than Grace ago: uploads of other
	// workers whose checkpoints are not committed yet. Default one hour.
	Grace time.Duration
	// MinLiveRatio: a pack whose live bytes are below this share of its
	// bytes is rewritten with only its live objects. Default 0.5.
	MinLiveRatio float64
	// DryRun counts what would go without deleting anything.
	DryRun bool
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// CollectReport says what Collect did (or would do).
type CollectReport struct {
	Examined       int64 `json:"examined"`
	Deleted        int64 `json:"deleted"`
	BytesReclaimed int64 `json:"bytes_reclaimed"`
	PacksRewritten int64 `json:"packs_rewritten"`
	PacksDeleted   int64 `json:"packs_deleted"`
	Orphans        int64 `json:"orphans_deleted"`
	KeptYoung      int64 `json:"kept_young"`
}

// Collect deletes what the remote holds that opts.Live does not keep:
// loose objects; packs whose objects are all dead (index first, then the
// pack); packs below opts.MinLiveRatio, rewritten with their live objects
// (Repack); and packs without an index (a writer that died between the
// two). Keys younger than opts.Grace stay, whatever Live says.
func (s *Store) Collect(ctx context.Context, opts CollectOptions) (CollectReport, error) {
	var rep CollectReport
	if opts.Live == nil {
		return rep, fmt.Errorf("s3 collect: no live set: %w", cas.ErrInvalidArgument)
	}
	if opts.Grace == 0 {
		opts.Grace = time.Hour
	}
	if opts.MinLiveRatio == 0 {
		opts.MinLiveRatio = 0.5
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	guard := opts.Guard
	if guard == nil {
		guard = func(_ []cas.ID, fn func(func(cas.ID) bool) error) error {
			return fn(func(cas.ID) bool { return false })
		}
	}
	cutoff := now().Add(-opts.Grace)
	young := func(o types.Object) bool { return o.LastModified != nil && o.LastModified.After(cutoff) }
	if err := s.reload(ctx); err != nil {
		return rep, err
	}

	// Loose objects.
	type loose struct {
		id   cas.ID
		size int64
	}
	var dead []loose
	err := s.listObjects(ctx, s.prefix+"o/", func(o types.Object) error {
		id, err := cas.ParseID(strings.TrimPrefix(aws.ToString(o.Key), s.prefix+"o/"))
		if err != nil {
			return nil
		}
		rep.Examined++
		switch {
		case opts.Live(id):
		case young(o):
			rep.KeptYoung++
		default:
			dead = append(dead, loose{id, aws.ToInt64(o.Size)})
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	for start := 0; start < len(dead); start += 100 {
		chunk := dead[start:min(start+100, len(dead))]
		ids := make([]cas.ID, len(chunk))
		for i, l := range chunk {
			ids[i] = l.id
		}
		err := guard(ids, func(keep func(cas.ID) bool) error {
			for _, l := range chunk {
				if keep(l.id) {
					continue
				}
				if !opts.DryRun {
					s.stats.Deletes.Add(1)
					if _, err := s.c.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.looseKey(l.id))}); err != nil && !isNotFound(err) {
						return wrap("collect "+l.id.Short(), err)
					}
				}
				rep.Deleted++
				rep.BytesReclaimed += l.size
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
	}

	// Packs, and orphans.
	idxTime := map[string]types.Object{}
	packObj := map[string]types.Object{}
	err = s.listObjects(ctx, s.prefix+"p/", func(o types.Object) error {
		rel := strings.TrimPrefix(aws.ToString(o.Key), s.prefix+"p/")
		if n, ok := strings.CutSuffix(rel, ".idx"); ok {
			idxTime[n] = o
		} else if n, ok := strings.CutSuffix(rel, ".pack"); ok {
			packObj[n] = o
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	for name, o := range packObj {
		if _, ok := idxTime[name]; ok || young(o) {
			continue
		}
		if !opts.DryRun {
			s.stats.Deletes.Add(1)
			if _, err := s.c.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: o.Key}); err != nil && !isNotFound(err) {
				return rep, wrap("collect orphan pack", err)
			}
		}
		rep.Orphans++
		rep.BytesReclaimed += aws.ToInt64(o.Size)
	}
	s.mu.Lock()
	packs := make(map[string][]entry, len(s.packs))
	for n, es := range s.packs {
		packs[n] = es
	}
	s.mu.Unlock()
	for name, es := range packs {
		o, ok := idxTime[name]
		if !ok {
			continue
		}
		rep.Examined += int64(len(es))
		var total, live int64
		var deadIDs []cas.ID
		for _, e := range es {
			total += e.size
			if opts.Live(e.id) {
				live += e.size
			} else {
				deadIDs = append(deadIDs, e.id)
			}
		}
		if len(deadIDs) == 0 {
			continue
		}
		if young(o) {
			rep.KeptYoung += int64(len(deadIDs))
			continue
		}
		if total > 0 && float64(live)/float64(total) >= opts.MinLiveRatio {
			continue
		}
		err := guard(deadIDs, func(keep func(cas.ID) bool) error {
			var gone int64
			var n int64
			for _, e := range es {
				if !opts.Live(e.id) && !keep(e.id) {
					gone += e.size
					n++
				}
			}
			if opts.DryRun {
				rep.Deleted += n
				rep.BytesReclaimed += gone
				return nil
			}
			if err := s.Repack(ctx, name, func(id cas.ID) bool { return opts.Live(id) || keep(id) }); err != nil {
				return err
			}
			rep.Deleted += n
			rep.BytesReclaimed += gone
			if n == int64(len(es)) {
				rep.PacksDeleted++
			} else {
				rep.PacksRewritten++
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}
