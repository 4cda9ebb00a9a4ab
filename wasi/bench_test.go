package wasi_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/esf-dev/esf/wasi"
	"github.com/esf-dev/esf/wasi/wasitest"
)

// BenchmarkRun measures Run end to end (hash, compiled-module lookup,
// mounts, instantiation, the guest, teardown) and reports p50/p90 per run:
//
//   - warm: the module is compiled in memory (the daemon has run it before);
//   - restart: a new Runtime on a CacheDir that holds the machine code (a
//     daemon restart): decode plus a load from disk;
//   - cold: a new Runtime on an empty CacheDir: a full compile.
//
// "tiny" is a hand-assembled module that calls proc_exit at once (Run's
// own cost); "go" is the Go test guest running "exit 0" (a Go runtime
// starting up, as most guests will).
//
//	go test ./wasi -run '^$' -bench Run -benchtime 50x
func BenchmarkRun(b *testing.B) {
	guest := wasitest.Guest(b)
	modules := []struct {
		name string
		bin  []byte
		args []string
	}{
		{"tiny", wasitest.ExitModule(0), nil},
		{"go", guest, []string{"guest", "exit", "0"}},
	}
	for _, m := range modules {
		spec := wasi.Spec{Module: m.bin, Args: m.args, Root: b.TempDir()}
		b.Run("warm/"+m.name, func(b *testing.B) {
			r := newRuntime(b, wasi.Options{})
			mustRun(b, r, spec) // compile
			measure(b, func() time.Duration {
				start := time.Now()
				mustRun(b, r, spec)
				return time.Since(start)
			})
		})
		b.Run("restart/"+m.name, func(b *testing.B) {
			dir := b.TempDir()
			r := newRuntime(b, wasi.Options{CacheDir: dir})
			mustRun(b, r, spec) // fill the cache dir
			measure(b, func() time.Duration { return restart(b, dir, spec) })
		})
		b.Run("cold/"+m.name, func(b *testing.B) {
			measure(b, func() time.Duration { return restart(b, b.TempDir(), spec) })
		})
	}
}

// restart creates a Runtime on dir, runs spec once and closes it; it
// returns the time to the end of the run.
func restart(b *testing.B, dir string, spec wasi.Spec) time.Duration {
	start := time.Now()
	r, err := wasi.New(context.Background(), wasi.Options{CacheDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	mustRun(b, r, spec)
	d := time.Since(start)
	if err := r.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
	return d
}

func mustRun(b *testing.B, r *wasi.Runtime, spec wasi.Spec) {
	res, err := r.Run(context.Background(), spec)
	if err != nil || res.ExitCode != 0 {
		b.Fatalf("Run: %v, exit %d", err, res.ExitCode)
	}
}

// measure runs op b.N times and reports the median and 90th percentile of
// the durations op returns, beside Go's mean (which counts op's untimed
// teardown too, and which a few slow runs on a shared machine skew).
func measure(b *testing.B, op func() time.Duration) {
	var ds []time.Duration
	for b.Loop() {
		ds = append(ds, op())
	}
	slices.Sort(ds)
	if len(ds) > 0 {
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds())/1000, "p90-ms")
	}
}
