package metrics

import (
	"encoding/json"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/esf-dev/esf/fusefs"
)

// Source is what the daemon reports; fabric implements it.
type Source interface {
	// Attempts returns the live and queued attempt counts.
	Attempts() (live, queued int)
	// Objects returns the content store's object count and bytes, and
	// whether the startup count has finished.
	Objects() (objects, bytes int64, ok bool)
	// ProjectionStats is the path of the projection's stats file.
	ProjectionStats() string
	// GC returns the totals of finished collections.
	GC() (runs, deleted, bytesReclaimed int64)
	// WASIMemory returns the WASI memory budget (0: unbounded), what the
	// running modules hold of it, and how many runs wait for it.
	WASIMemory() (budget, inUse uint64, waiting int)
}

// RemoteSource is what a daemon with a remote content store (esfd
// --cas-remote) reports besides Source; fabric implements it.
type RemoteSource interface {
	// RemoteCounters returns the objects waiting in the upload queue and
	// the cache's fetches, uploads, corrupt fetches and evictions so far;
	// ok is false without a remote store.
	RemoteCounters() (queued, fetches, uploads, corrupt, evictions int64, ok bool)
}

// Metrics is one daemon's registry.
type Metrics struct {
	reg *prometheus.Registry
	ops *prometheus.HistogramVec
}

// New registers esf's collectors over src, plus Go and process metrics.
func New(src Source) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "esf_operation_duration_seconds",
			Help: "Latency of API operations by operation and result code.",
			// 100µs .. ~13s: fork and activate live in the first buckets.
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"op", "code"}),
	}
	reg.MustRegister(m.ops,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "esf_attempts_live", Help: "Attempts holding capacity (active or sealing)."},
			func() float64 { l, _ := src.Attempts(); return float64(l) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "esf_attempts_queued", Help: "Attempts waiting for capacity."},
			func() float64 { _, q := src.Attempts(); return float64(q) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "esf_cas_objects", Help: "Objects in the local content store."},
			func() float64 { o, _, _ := src.Objects(); return float64(o) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "esf_cas_bytes", Help: "Bytes in the local content store."},
			func() float64 { _, b, _ := src.Objects(); return float64(b) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "esf_gc_runs_total", Help: "Finished garbage collections."},
			func() float64 { r, _, _ := src.GC(); return float64(r) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "esf_gc_deleted_objects_total", Help: "Objects deleted by GC."},
			func() float64 { _, d, _ := src.GC(); return float64(d) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "esf_gc_reclaimed_bytes_total", Help: "Bytes reclaimed by GC."},
			func() float64 { _, _, b := src.GC(); return float64(b) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "esf_wasi_memory_budget_bytes", Help: "Memory all running WASI modules may hold (esfd --wasi-memory; 0: unbounded)."},
			func() float64 { b, _, _ := src.WASIMemory(); return float64(b) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "esf_wasi_memory_bytes", Help: "Memory the running WASI modules hold of the budget."},
			func() float64 { _, u, _ := src.WASIMemory(); return float64(u) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "esf_wasi_runs_waiting", Help: "WASI runs queued for memory."},
			func() float64 { _, _, w := src.WASIMemory(); return float64(w) }),
		&fuseCollector{path: src.ProjectionStats},
	)
	if rs, ok := src.(RemoteSource); ok {
		if _, _, _, _, _, ok := rs.RemoteCounters(); ok {
			counter := func(name, help string, pick func(q, f, u, c, e int64) int64) prometheus.Collector {
				return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 {
					q, f, u, c, e, _ := rs.RemoteCounters()
					return float64(pick(q, f, u, c, e))
				})
			}
			reg.MustRegister(
				prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "esf_remote_upload_queue_objects",
					Help: "Objects acknowledged locally and waiting for upload to the remote content store (async durability)."},
					func() float64 { q, _, _, _, _, _ := rs.RemoteCounters(); return float64(q) }),
				counter("esf_remote_fetches_total", "Objects fetched from the remote content store into the cache.",
					func(_, f, _, _, _ int64) int64 { return f }),
				counter("esf_remote_uploads_total", "Objects uploaded to the remote content store.",
					func(_, _, u, _, _ int64) int64 { return u }),
				counter("esf_remote_corrupt_fetches_total", "Fetches refused because the remote's bytes did not match twice.",
					func(_, _, _, c, _ int64) int64 { return c }),
				counter("esf_cache_evictions_total", "Objects evicted from the cache by --cache-size.",
					func(_, _, _, _, e int64) int64 { return e }),
			)
		}
	}
	return m
}

// Observe records one operation's latency and result code ("" for ok).
func (m *Metrics) Observe(op, code string, d time.Duration) {
	if code == "" {
		code = "ok"
	}
	m.ops.WithLabelValues(op, code).Observe(d.Seconds())
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

var corruptDesc = prometheus.NewDesc("esf_cas_corrupt_blobs_total",
	"Opens the FUSE projection refused (EIO) because a blob no longer matched its id (each is also a cas.corrupt event).",
	nil, nil)

var fuseDesc = prometheus.NewDesc("esf_fuse_operations_total",
	"Operations served by the FUSE projection server, by kind (reads: those not passed through to the kernel).",
	[]string{"op"}, nil)

// fuseCollector reads the projection's stats file on each scrape.
type fuseCollector struct{ path func() string }

func (c *fuseCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fuseDesc
	ch <- corruptDesc
}

func (c *fuseCollector) Collect(ch chan<- prometheus.Metric) {
	raw, err := os.ReadFile(c.path())
	if err != nil {
		return // projection not running: no samples rather than zeros
	}
	var s fusefs.Snapshot
	if json.Unmarshal(raw, &s) != nil {
		return
	}
	for op, v := range map[string]int64{"lookup": s.Lookups, "readdir": s.Readdirs, "open": s.Opens,
		"tree_read": s.TreeReads, "blob_verify": s.BlobVerifies, "read": s.Reads} {
		ch <- prometheus.MustNewConstMetric(fuseDesc, prometheus.CounterValue, float64(v), op)
	}
	ch <- prometheus.MustNewConstMetric(corruptDesc, prometheus.CounterValue, float64(s.CorruptBlobs))
}
