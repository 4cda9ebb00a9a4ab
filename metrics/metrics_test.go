package metrics

import (
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type fakeSource struct{ stats string }

func (fakeSource) Attempts() (int, int)                 { return 3, 2 }
func (fakeSource) Objects() (int64, int64, bool)        { return 10, 4096, true }
func (s fakeSource) ProjectionStats() string            { return s.stats }
func (fakeSource) GC() (runs, deleted, reclaimed int64) { return 1, 5, 500 }
func (fakeSource) WASIMemory() (uint64, uint64, int)    { return 1 << 30, 1 << 20, 1 }

func TestExposition(t *testing.T) {
	stats := filepath.Join(t.TempDir(), "stats")
	if err := os.WriteFile(stats, []byte(`{"lookups":7,"opens":2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	m := New(fakeSource{stats: stats})
	m.Observe("fork", "", 300*time.Microsecond)
	m.Observe("activate", "not_found", time.Millisecond)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		"esf_attempts_live 3", "esf_attempts_queued 2", "esf_cas_objects 10", "esf_cas_bytes 4096",
		`esf_fuse_operations_total{op="lookup"} 7`, `esf_fuse_operations_total{op="open"} 2`,
		`esf_operation_duration_seconds_count{code="ok",op="fork"} 1`,
		`esf_operation_duration_seconds_count{code="not_found",op="activate"} 1`,
		"esf_gc_reclaimed_bytes_total 500", "go_goroutines",
		"esf_wasi_memory_budget_bytes 1.073741824e+09", "esf_wasi_memory_bytes 1.048576e+06", "esf_wasi_runs_waiting 1",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// A projection that is not running yields no FUSE samples, not zeros.
	m2 := New(fakeSource{stats: filepath.Join(t.TempDir(), "absent")})
	rec = httptest.NewRecorder()
	m2.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ = io.ReadAll(rec.Body)
	if strings.Contains(string(body), "esf_fuse_operations_total{") {
		t.Error("FUSE samples without a projection")
	}
}
