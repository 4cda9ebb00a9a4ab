package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	gorunc "github.com/containerd/go-runc"

	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/testenv"
)

// The runc executor against runc alone, on a busybox-static rootfs:
//
//	BenchmarkRuncActivateVsBareRun  Start + first "exec true" (what an
//	    activate then a first exec cost) against "runc run" of the same
//	    rootfs running true, interleaved so both see the same machine
//	    load; reports both p50s and their ratio.
//	BenchmarkRuncExecRoundTrip      "exec true" into a running container,
//	    p50 and p90.
//
// Run with: go test -run XXX -bench Runc ./bench/ (needs root and runc).

var (
	initOnce sync.Once
	initBin  string
	initErr  error
)

// sharedInit builds the executor's init once per process (into a
// temporary directory that stays until the process ends: the benchmarks
// of a run share it).
func sharedInit() (string, error) {
	initOnce.Do(func() {
		d, err := os.MkdirTemp("", "esf-bench-init-")
		if err != nil {
			initErr = err
			return
		}
		initBin, initErr = runctest.BuildInit(d)
	})
	return initBin, initErr
}

// busyboxRootfs makes dir a busybox rootfs with the mountpoints runc needs,
// so that runs do not create them.
func busyboxRootfs(dir string) error {
	if err := runctest.Busybox(dir); err != nil {
		return err
	}
	for _, d := range []string{"proc", "dev", "sys", "run"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// runcRig is a scenario's runc set-up: the executor's init and a busybox
// rootfs in the scenario's own directory, for executors and daemons that
// run containers in it (daemon).
type runcRig struct {
	e      *bench.Env
	init   string
	dir    string // the scenario's directory
	rootfs string
}

// newRuncRig builds the init (once per process) and a busybox rootfs in a
// new directory named after name. Without what runc needs
// (runctest.Check) it adds a skipped row named row and returns nil.
func newRuncRig(e *bench.Env, name, row string) (*runcRig, error) {
	if err := runctest.Check(); err != nil {
		e.Add(bench.Row{Name: row, Verdict: bench.VerdictSkip, Note: err.Error()})
		return nil, nil
	}
	initPath, err := sharedInit()
	if err != nil {
		return nil, err
	}
	dir, err := e.Mkdir(name)
	if err != nil {
		return nil, err
	}
	r := &runcRig{e: e, init: initPath, dir: dir, rootfs: filepath.Join(dir, "rootfs")}
	return r, busyboxRootfs(r.rootfs)
}

// daemon starts a runc executor with o (Init and StateDir are set here;
// the cgroups of o.Namespace go when the scenario ends) and a daemon named
// name that runs it, with configure (if not nil) applied to its options
// too, over a node of the rig's rootfs.
func (r *runcRig) daemon(ctx context.Context, name string, o runc.Options, configure func(*fabric.Options)) (*bench.Daemon, string, *runc.Executor, error) {
	o.Init, o.StateDir = r.init, filepath.Join(r.dir, "runc-state", name)
	ex, err := runc.New(o)
	if err != nil {
		return nil, "", nil, err
	}
	r.e.Cleanup(func() error { runctest.RemoveCgroupParents(o.Namespace); return nil })
	d, node, err := execDaemon(ctx, r.e, name, r.rootfs, func(fo *fabric.Options) {
		fo.Executor = ex
		if configure != nil {
			configure(fo)
		}
	})
	return d, node, ex, err
}

// runcFixture builds the init (once per process) and a busybox rootfs.
func runcFixture(b *testing.B) (initPath, rootfs, dir string) {
	b.Helper()
	testenv.Require(b, runctest.Needs...)
	if _, err := sharedInit(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { runctest.RemoveCgroupParents("esf-bench") })
	dir = b.TempDir()
	rootfs = filepath.Join(dir, "rootfs")
	// The mountpoints keep the bare runs from creating them in the rootfs
	// on every iteration; the executor's Stop removes its own anyway.
	if err := busyboxRootfs(rootfs); err != nil {
		b.Fatal(err)
	}
	return initBin, rootfs, dir
}

func p50(ds []time.Duration) time.Duration { return quantile(ds, 0.5) }

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// bareBundle writes a bundle that runs true in the same default spec the
// executor uses (namespaces, seccomp, masked paths), without its init.
func bareBundle(b *testing.B, dir, rootfs string) string {
	b.Helper()
	bundle, err := writeBareBundle(dir, rootfs)
	if err != nil {
		b.Fatal(err)
	}
	return bundle
}

// writeBareBundle is bareBundle for callers without a testing.B: it
// returns the bundle directory, dir/bare-bundle.
func writeBareBundle(dir, rootfs string) (string, error) {
	ctx := namespaces.WithNamespace(context.Background(), "esf-bench")
	s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "bare"},
		oci.WithRootFSPath(rootfs), oci.WithProcessArgs("/bin/true"), oci.WithDefaultPathEnv,
		oci.WithDefaultUnixDevices, oci.WithNoNewPrivileges, seccomp.WithDefaultProfile())
	if err != nil {
		return "", err
	}
	bundle := filepath.Join(dir, "bare-bundle")
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return "", err
	}
	j, err := json.Marshal(s)
	if err != nil {
		return "", err
	}
	return bundle, os.WriteFile(filepath.Join(bundle, "config.json"), j, 0o600)
}

func execTrue(ctx context.Context, e *runc.Executor, id string) error {
	p, err := e.Exec(ctx, id, executor.ExecSpec{Args: []string{"true"}})
	if err != nil {
		return err
	}
	code, err := p.Wait()
	if err == nil && code != 0 {
		err = fmt.Errorf("true exited %d", code)
	}
	return err
}

func BenchmarkRuncActivateVsBareRun(b *testing.B) {
	initPath, rootfs, dir := runcFixture(b)
	ctx := context.Background()
	e, err := runc.New(runc.Options{StateDir: filepath.Join(dir, "state"), Init: initPath, Namespace: "esf-bench"})
	if err != nil {
		b.Fatal(err)
	}
	bundle := bareBundle(b, dir, rootfs)
	bare := &gorunc.Runc{Root: filepath.Join(dir, "bare-root")}

	var act, run, stop []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("bench-%d", i)
		t0 := time.Now()
		if err := e.Start(ctx, id, executor.Spec{Rootfs: rootfs}); err != nil {
			b.Fatal(err)
		}
		if err := execTrue(ctx, e, id); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := e.Stop(ctx, id); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if status, err := bare.Run(ctx, "bare-"+id, bundle, &gorunc.CreateOpts{}); err != nil || status != 0 {
			b.Fatalf("runc run: %d %v", status, err)
		}
		t3 := time.Now()
		act, stop, run = append(act, t1.Sub(t0)), append(stop, t2.Sub(t1)), append(run, t3.Sub(t2))
	}
	b.StopTimer()
	b.ReportMetric(ms(p50(act)), "activate+exec-p50-ms")
	b.ReportMetric(ms(p50(run)), "bare-run-p50-ms")
	b.ReportMetric(float64(p50(act))/float64(p50(run)), "ratio")
	b.ReportMetric(ms(p50(stop)), "stop-p50-ms")
}

func BenchmarkRuncExecRoundTrip(b *testing.B) {
	initPath, rootfs, dir := runcFixture(b)
	ctx := context.Background()
	e, err := runc.New(runc.Options{StateDir: filepath.Join(dir, "state"), Init: initPath, Namespace: "esf-bench"})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Start(ctx, "bench-exec", executor.Spec{Rootfs: rootfs}); err != nil {
		b.Fatal(err)
	}
	defer e.Stop(ctx, "bench-exec")
	if err := execTrue(ctx, e, "bench-exec"); err != nil { // warm
		b.Fatal(err)
	}
	var ds []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := execTrue(ctx, e, "bench-exec"); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(t0))
	}
	b.StopTimer()
	b.ReportMetric(ms(p50(ds)), "p50-ms")
	b.ReportMetric(ms(quantile(ds, 0.9)), "p90-ms")
}
