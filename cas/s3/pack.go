package s3

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sync/errgroup"

	"github.com/esf-dev/esf/cas"
)

const (
	idxMagic     = "esfpack1"
	idxEntrySize = cas.IDSize + 16
)

// entry is one object of a pack.
type entry struct {
	id        cas.ID
	off, size int64
}

func encodeIdx(es []entry) []byte {
	es = slices.Clone(es)
	slices.SortFunc(es, func(a, b entry) int { return bytes.Compare(a.id[:], b.id[:]) })
	b := make([]byte, 0, len(idxMagic)+len(es)*idxEntrySize)
	b = append(b, idxMagic...)
	for _, e := range es {
		b = append(b, e.id[:]...)
		b = binary.BigEndian.AppendUint64(b, uint64(e.off))
		b = binary.BigEndian.AppendUint64(b, uint64(e.size))
	}
	return b
}

func decodeIdx(b []byte) ([]entry, error) {
	if !bytes.HasPrefix(b, []byte(idxMagic)) || (len(b)-len(idxMagic))%idxEntrySize != 0 {
		return nil, fmt.Errorf("pack index: bad format: %w", cas.ErrCorrupt)
	}
	b = b[len(idxMagic):]
	es := make([]entry, 0, len(b)/idxEntrySize)
	for len(b) > 0 {
		var e entry
		copy(e.id[:], b)
		e.off = int64(binary.BigEndian.Uint64(b[cas.IDSize:]))
		e.size = int64(binary.BigEndian.Uint64(b[cas.IDSize+8:]))
		if e.off < 0 || e.size < 0 {
			return nil, fmt.Errorf("pack index: bad entry: %w", cas.ErrCorrupt)
		}
		es = append(es, e)
		b = b[idxEntrySize:]
	}
	return es, nil
}

// lookup finds a packed object. With refresh, or before the indexes were
// ever loaded, it reloads them first (an entry may be stale: its pack
// repacked by another writer).
func (s *Store) lookup(ctx context.Context, id cas.ID, refresh bool) (loc, bool, error) {
	s.mu.Lock()
	l, ok := s.idx[id]
	loaded := s.loaded
	s.mu.Unlock()
	if !refresh && (ok || loaded) {
		return l, ok, nil
	}
	if err := s.reload(ctx); err != nil {
		return loc{}, false, err
	}
	s.mu.Lock()
	l, ok = s.idx[id]
	s.mu.Unlock()
	return l, ok, nil
}

// Reload lists the pack indexes again, forgetting packs another process
// deleted (a remote collection on another worker): a Has or Stat after it
// does not find objects of those packs in the stale index.
func (s *Store) Reload(ctx context.Context) error { return s.reload(ctx) }

// reload lists the pack indexes, loads the new ones and forgets the ones
// gone (repacked). Concurrent callers share one reload that started after
// they asked.
func (s *Store) reload(ctx context.Context) error {
	s.mu.Lock()
	asked := s.epoch
	s.mu.Unlock()
	s.refresh.Lock()
	defer s.refresh.Unlock()
	s.mu.Lock()
	if s.doneEpoch > asked {
		s.mu.Unlock()
		return nil
	}
	s.epoch++
	started := s.epoch
	s.mu.Unlock()

	names := map[string]bool{}
	err := s.list(ctx, s.prefix+"p/", func(key string, _ int64) error {
		if name, ok := strings.CutSuffix(strings.TrimPrefix(key, s.prefix+"p/"), ".idx"); ok {
			if _, err := cas.ParseID(name); err == nil {
				names[name] = true
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	var missing []string
	for name := range names {
		if _, ok := s.packs[name]; !ok {
			missing = append(missing, name)
		}
	}
	s.mu.Unlock()
	loaded := make([][]entry, len(missing))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.par)
	for i, name := range missing {
		g.Go(func() error {
			es, err := s.loadIdx(gctx, name)
			if errors.Is(err, cas.ErrNotFound) {
				return nil // repacked since the listing
			}
			loaded[i] = es
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	removed := false
	for name := range s.packs {
		if !names[name] {
			delete(s.packs, name)
			removed = true
		}
	}
	for i, name := range missing {
		if loaded[i] != nil {
			s.packs[name] = loaded[i]
		}
	}
	if removed {
		s.idx = map[cas.ID]loc{}
		for name, es := range s.packs {
			s.index(name, es)
		}
	} else {
		for i, name := range missing {
			s.index(name, loaded[i])
		}
	}
	s.loaded = true
	s.doneEpoch = started
	return nil
}

// index adds a pack's entries to the in-memory index; s.mu is held.
func (s *Store) index(name string, es []entry) {
	for _, e := range es {
		if _, ok := s.idx[e.id]; !ok {
			s.idx[e.id] = loc{pack: name, off: e.off, size: e.size}
		}
	}
}

// unindex forgets a pack; s.mu is held.
func (s *Store) unindex(name string) {
	es := s.packs[name]
	delete(s.packs, name)
	for _, e := range es {
		if l, ok := s.idx[e.id]; ok && l.pack == name {
			delete(s.idx, e.id)
		}
	}
	// An id that another pack also holds stays reachable there.
	for other, oes := range s.packs {
		for _, e := range oes {
			if _, ok := s.idx[e.id]; !ok {
				s.idx[e.id] = loc{pack: other, off: e.off, size: e.size}
			}
		}
	}
}

// loadIdx reads and verifies one index: its name is the BLAKE3 of its
// bytes.
func (s *Store) loadIdx(ctx context.Context, name string) ([]entry, error) {
	want, err := cas.ParseID(name)
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 2 { // a corrupted transfer is read once more
		s.stats.Gets.Add(1)
		out, err := s.c.GetObject(ctx, &awss3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.idxKey(name))})
		if err != nil {
			return nil, wrap("load pack index "+name[:12], err)
		}
		b, err := io.ReadAll(out.Body)
		out.Body.Close()
		s.stats.BytesIn.Add(int64(len(b)))
		if err == nil && cas.Sum(b) != want {
			err = fmt.Errorf("content does not match its name: %w", cas.ErrCorrupt)
		}
		if err == nil {
			return decodeIdx(b)
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, wrap("load pack index "+name[:12], lastErr)
}

// Source is an object to Upload: its id and size, and how to read it.
type Source struct {
	cas.Info
	Open func() (io.ReadSeekCloser, error)
}

// Upload stores objects: those below the pack threshold in packs, the
// others loose, all with conditional PUTs, Options.Parallel requests at a
// time. It reads every object and checks it against its id before sending
// it, so a corrupted source is never stored (ErrCorrupt). It does not ask
// whether objects are stored already: a caller that knows they are not
// (new objects of a seal) pays no lookups, and a duplicate is harmless.
func (s *Store) Upload(ctx context.Context, objs []Source) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var small, large []Source
	seen := map[cas.ID]bool{}
	for _, o := range objs {
		if seen[o.ID] {
			continue
		}
		seen[o.ID] = true
		if s.thresh > 0 && o.Size < s.thresh {
			small = append(small, o)
		} else {
			large = append(large, o)
		}
	}
	// One small object alone gains nothing from a pack.
	if len(small) == 1 {
		large, small = append(large, small[0]), nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.par)
	for _, o := range large {
		g.Go(func() error { return s.uploadLoose(gctx, o) })
	}
	var group []Source
	var groupBytes int64
	flush := func() {
		if len(group) == 0 {
			return
		}
		grp := group
		group, groupBytes = nil, 0
		g.Go(func() error { return s.uploadPack(gctx, grp) })
	}
	for _, o := range small {
		if groupBytes+o.Size > s.packMax {
			flush()
		}
		group = append(group, o)
		groupBytes += o.Size
	}
	flush()
	return g.Wait()
}

func (s *Store) uploadLoose(ctx context.Context, o Source) error {
	rc, err := o.Open()
	if err != nil {
		return fmt.Errorf("upload %s: %w", o.ID.Short(), err)
	}
	defer rc.Close()
	// Verify first: the request must carry exactly the object's bytes.
	h := cas.NewHasher()
	n, err := io.Copy(h, rc)
	if err != nil {
		return fmt.Errorf("upload %s: %w", o.ID.Short(), err)
	}
	if cas.IDFromHash(h) != o.ID || n != o.Size {
		return fmt.Errorf("upload %s: source does not match its id: %w", o.ID.Short(), cas.ErrCorrupt)
	}
	if _, err := rc.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("upload %s: %w", o.ID.Short(), err)
	}
	if _, err := s.putIfAbsent(ctx, s.looseKey(o.ID), rc, o.Size); err != nil {
		return wrap("upload "+o.ID.Short(), err)
	}
	return nil
}

// uploadPack writes one pack and then its index, and indexes it.
func (s *Store) uploadPack(ctx context.Context, objs []Source) error {
	var buf bytes.Buffer
	es := make([]entry, 0, len(objs))
	for _, o := range objs {
		if err := ctx.Err(); err != nil {
			return err
		}
		rc, err := o.Open()
		if err != nil {
			return fmt.Errorf("upload %s: %w", o.ID.Short(), err)
		}
		off := int64(buf.Len())
		_, err = io.Copy(&buf, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("upload %s: %w", o.ID.Short(), err)
		}
		b := buf.Bytes()[off:]
		if int64(len(b)) != o.Size || cas.Sum(b) != o.ID {
			return fmt.Errorf("upload %s: source does not match its id: %w", o.ID.Short(), cas.ErrCorrupt)
		}
		es = append(es, entry{id: o.ID, off: off, size: o.Size})
	}
	return s.writePack(ctx, buf.Bytes(), es)
}

// writePack stores a pack's bytes, then its index (which makes it
// visible), and indexes it here.
func (s *Store) writePack(ctx context.Context, data []byte, es []entry) error {
	ib := encodeIdx(es)
	name := cas.Sum(ib).String()
	if _, err := s.putIfAbsent(ctx, s.packKey(name), bytes.NewReader(data), int64(len(data))); err != nil {
		return wrap("put pack "+name[:12], err)
	}
	if _, err := s.putIfAbsent(ctx, s.idxKey(name), bytes.NewReader(ib), int64(len(ib))); err != nil {
		return wrap("put pack index "+name[:12], err)
	}
	s.mu.Lock()
	if _, ok := s.packs[name]; !ok {
		s.packs[name] = es
		s.index(name, es)
	}
	s.mu.Unlock()
	return nil
}

// Repack rewrites the pack named name with only the objects keep accepts:
// the new pack (if any object stays) and its index are written first, then
// the old index and the old pack are deleted. Each kept object is verified
// on the way. Repacks are serialized within the Store.
func (s *Store) Repack(ctx context.Context, name string, keep func(cas.ID) bool) error {
	s.repack.Lock()
	defer s.repack.Unlock()
	s.mu.Lock()
	es, ok := s.packs[name]
	s.mu.Unlock()
	if !ok {
		return nil // gone already
	}
	var kept []entry
	for _, e := range es {
		if keep(e.id) {
			kept = append(kept, e)
		}
	}
	if len(kept) > 0 {
		s.stats.Gets.Add(1)
		out, err := s.c.GetObject(ctx, &awss3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(s.packKey(name))})
		if err != nil {
			return wrap("repack "+name[:12], err)
		}
		old, err := io.ReadAll(out.Body)
		out.Body.Close()
		s.stats.BytesIn.Add(int64(len(old)))
		if err != nil {
			return wrap("repack "+name[:12], err)
		}
		var data []byte
		var nes []entry
		for _, e := range kept {
			if e.off+e.size > int64(len(old)) || cas.Sum(old[e.off:e.off+e.size]) != e.id {
				return fmt.Errorf("repack %s: object %s: %w", name[:12], e.id.Short(), cas.ErrCorrupt)
			}
			nes = append(nes, entry{id: e.id, off: int64(len(data)), size: e.size})
			data = append(data, old[e.off:e.off+e.size]...)
		}
		if err := s.writePack(ctx, data, nes); err != nil {
			return err
		}
	}
	for _, key := range []string{s.idxKey(name), s.packKey(name)} {
		s.stats.Deletes.Add(1)
		if _, err := s.c.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)}); err != nil && !isNotFound(err) {
			return wrap("repack "+name[:12], err)
		}
	}
	s.mu.Lock()
	s.unindex(name)
	s.mu.Unlock()
	return nil
}

// Orphans lists pack keys without an index (a batch that died between
// writing a pack and its index, or an aborted one): invisible bytes for GC
// to delete once they are older than any commit in flight.
func (s *Store) Orphans(ctx context.Context) ([]string, error) {
	packs, idxs := map[string]bool{}, map[string]bool{}
	err := s.list(ctx, s.prefix+"p/", func(key string, _ int64) error {
		rel := strings.TrimPrefix(key, s.prefix+"p/")
		if n, ok := strings.CutSuffix(rel, ".pack"); ok {
			packs[n] = true
		} else if n, ok := strings.CutSuffix(rel, ".idx"); ok {
			idxs[n] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for n := range packs {
		if !idxs[n] {
			out = append(out, s.packKey(n))
		}
	}
	slices.Sort(out)
	return out, nil
}
