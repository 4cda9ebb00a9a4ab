package fabric

import (
	"context"
	"path/filepath"
	"sync/atomic"

	"github.com/esf-dev/esf/fusefs"
)

// What the daemon reports to metrics (metrics.Source).

// Attempts returns the live and queued attempt counts of this daemon.
func (f *Fabric) Attempts() (live, queued int) { return f.quota.counts() }

// Objects returns the store's object count and bytes without waiting;
// ok is false until the startup count has finished.
func (f *Fabric) Objects() (objects, bytes int64, ok bool) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o, b, err := f.counting.tally(ctx)
	return o, b, err == nil
}

// ProjectionStats is the projection's stats file.
func (f *Fabric) ProjectionStats() string { return filepath.Join(f.projection.mnt, fusefs.StatsName) }

// GC returns the totals of finished collections.
func (f *Fabric) GC() (runs, deleted, bytesReclaimed int64) {
	return f.gcStats.runs.Load(), f.gcStats.deleted.Load(), f.gcStats.bytes.Load()
}

type gcTotals struct {
	runs, deleted, bytes atomic.Int64
}

// WASIMemory returns the WASI runtime's memory budget (0: unbounded or no
// runtime), what running modules hold of it and how many runs wait.
func (f *Fabric) WASIMemory() (budget, inUse uint64, waiting int) {
	if f.wasm == nil {
		return 0, 0, 0
	}
	s := f.wasm.MemoryStats()
	return s.Budget, s.InUse, s.Waiting
}

// RemoteCounters implements metrics.RemoteSource.
func (f *Fabric) RemoteCounters() (queued, fetches, uploads, corrupt, evictions int64, ok bool) {
	if f.tier == nil {
		return 0, 0, 0, 0, 0, false
	}
	st := f.tier.Stats()
	return int64(f.tier.QueueStatus().Objects), st.Fetches.Load(), st.Uploads.Load(), st.Corrupt.Load(), st.Evictions.Load(), true
}
