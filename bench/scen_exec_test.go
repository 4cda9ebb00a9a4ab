package bench_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	gorunc "github.com/containerd/go-runc"

	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/wasi"
	"github.com/esf-dev/esf/wasi/wasitest"
)

// The executors as a user drives them: activate an attempt with executor
// wasi or runc and run a first command, through the API of a daemon that
// has the executor, against the executor (or runc) alone. These scenarios
// live in a test file because their fixtures (the runc init, busybox, the
// Go test guest) are test helpers; the rows are the suite's like any other.

func init() {
	bench.Register(bench.Scenario{Name: "wasi", Order: 70, Replaces: []string{"wasi"}, Run: benchWASI})
	bench.Register(bench.Scenario{Name: "runc", Order: 75, Replaces: []string{"runc"}, Run: benchRunc})
}

// execDaemon starts a private daemon configured by configure with a group
// rooted at an import of src.
func execDaemon(ctx context.Context, e *bench.Env, name, src string, configure func(*fabric.Options)) (*bench.Daemon, string, error) {
	d, err := e.StartDaemon(ctx, name, configure)
	if err != nil {
		return nil, "", err
	}
	imp, err := d.Ops.Import(ctx, src)
	if err != nil {
		return nil, "", err
	}
	g, err := d.Ops.CreateGroup(ctx, imp.RootID)
	if err != nil {
		return nil, "", err
	}
	return d, g.Node.NodeID, nil
}

// activateAndRun times an activation with executor and one command in it
// (what a user waits for before the first result); the release that
// follows is not timed.
func activateAndRun(ctx context.Context, d *bench.Daemon, node, executor string, req fabric.ExecRequest) (bench.Measurement, error) {
	var aid string
	m, err := bench.Timed(1, func() error {
		a, err := d.Ops.ActivateAttempt(ctx, fabric.ActivateRequest{NodeID: node, Executor: executor})
		if err != nil {
			return err
		}
		aid, req.AttemptID = a.AttemptID, a.AttemptID
		return d.Ops.Exec(ctx, req)
	})
	if aid != "" {
		err = errors.Join(err, d.Ops.Release(ctx, aid))
	}
	return m, err
}

// withNonce returns module with a custom section holding n appended: the
// same program under another content id, which no compile cache knows.
func withNonce(module []byte, n uint64) []byte {
	name := "esf-bench-nonce"
	var payload []byte
	payload = binary.AppendUvarint(payload, uint64(len(name)))
	payload = append(payload, name...)
	payload = binary.LittleEndian.AppendUint64(payload, n)
	out := append([]byte(nil), module...)
	out = append(out, 0) // custom section
	out = binary.AppendUvarint(out, uint64(len(payload)))
	return append(out, payload...)
}

// buildGuest builds the Go test guest of package wasi (a Go runtime
// starting up, as most real modules will).
func buildGuest(ctx context.Context, dir string) ([]byte, error) {
	out := filepath.Join(dir, "guest.wasm")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, wasitest.GuestPkg)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %v: %s", wasitest.GuestPkg, err, b)
	}
	return os.ReadFile(out)
}

func benchWASI(ctx context.Context, e *bench.Env) error {
	cache, err := e.Mkdir("wasi-cache")
	if err != nil {
		return err
	}
	wrt, err := wasi.New(ctx, wasi.Options{CacheDir: cache})
	if err != nil {
		return err
	}
	// Registered before the daemon, so it closes after it.
	e.Cleanup(func() error { return wrt.Close(context.Background()) })
	src, err := e.Mkdir("wasi-src")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "input.txt"), []byte("input\n"), 0o644); err != nil {
		return err
	}
	d, node, err := execDaemon(ctx, e, "wasi", src, func(o *fabric.Options) { o.WASI = wrt })
	if err != nil {
		return err
	}
	scratch, err := e.Mkdir("wasi-direct")
	if err != nil {
		return err
	}
	type module struct {
		name     string
		bin      []byte
		args     []string
		coldReps int
		warmReps int
	}
	modules := []module{{name: "tiny module", bin: wasitest.ExitModule(0), args: []string{"tiny"},
		coldReps: e.Size(10, 20), warmReps: e.Size(30, 60)}}
	if guest, err := buildGuest(ctx, scratch); err != nil {
		e.Add(bench.Row{Name: "wasi activate + run, Go module", Verdict: bench.VerdictSkip, Note: err.Error()})
	} else {
		modules = append(modules, module{name: "Go module", bin: guest, args: []string{"guest", "exit", "0"},
			coldReps: e.Size(2, 3), warmReps: e.Size(20, 40)})
	}
	put := func(bin []byte) (string, error) {
		info, _, err := d.Fabric.Store().Put(ctx, bytes.NewReader(bin))
		return info.ID.String(), err
	}
	nonce := uint64(0)
	for _, m := range modules {
		id, err := put(m.bin)
		if err != nil {
			return err
		}
		run := func(module string) func(context.Context) (bench.Measurement, error) {
			return func(ctx context.Context) (bench.Measurement, error) {
				return activateAndRun(ctx, d, node, fabric.ExecutorWASI, fabric.ExecRequest{Module: module, Args: m.args})
			}
		}
		direct := func(ctx context.Context) (bench.Measurement, error) {
			return bench.Timed(1, func() error {
				res, err := wrt.Run(ctx, wasi.Spec{Module: m.bin, Args: m.args, Root: scratch})
				if err == nil && res.ExitCode != 0 {
					err = fmt.Errorf("%s exited %d", m.name, res.ExitCode)
				}
				return err
			})
		}
		cold := func(ctx context.Context) (bench.Measurement, error) {
			nonce++
			fresh, err := put(withNonce(m.bin, nonce))
			if err != nil {
				return bench.Measurement{}, err
			}
			return run(fresh)(ctx)
		}
		// The first run compiles: the warm rows start from a warm cache.
		if _, err := run(id)(ctx); err != nil {
			return err
		}
		ms, err := bench.Interleave(ctx, m.warmReps, run(id), direct)
		if err != nil {
			return err
		}
		warm, alone := bench.Latencies(ms[0]), bench.Latencies(ms[1])
		path := d.Ops.Path("activate")
		e.Add(bench.Row{Name: "wasi activate + run, warm cache (" + m.name + ")", Value: warm.P50, Unit: "ms", P90: warm.P90, N: warm.N, Samples: warm.Values,
			Baseline: "wasi Run alone, warm", BaselineValue: alone.P50, Targets: []bench.Target{bench.AtMost(20)}, Path: path,
			Note: "activate --executor wasi + exec of a module stored in the CAS (compiled before), through the API; the release after it is not timed"})
		ms, err = bench.Interleave(ctx, m.coldReps, cold)
		if err != nil {
			return err
		}
		c := bench.Latencies(ms[0])
		e.Add(bench.Row{Name: "wasi activate + run, cold cache (" + m.name + ")", Value: c.P50, Unit: "ms", P90: c.P90, N: c.N, Samples: c.Values,
			Baseline: "warm cache", BaselineValue: warm.P50, Path: path,
			Note: "the module made new each time (a custom section with a nonce), so it is compiled first"})
	}
	return nil
}

func benchRunc(ctx context.Context, e *bench.Env) error {
	const rowName = "runc activate + first exec"
	rig, err := newRuncRig(e, "runc", rowName)
	if rig == nil || err != nil {
		return err
	}
	d, node, ex, err := rig.daemon(ctx, "runc", runc.Options{Namespace: "esf-bench"}, nil)
	if err != nil {
		return err
	}
	// The same with a warm pool (esfd --runc-pool 2), in a
	// daemon of its own.
	const runcPool = 2
	pd, pnode, pex, err := rig.daemon(ctx, "runc-pool", runc.Options{Namespace: "esf-bench-pool", PoolSize: runcPool}, nil)
	if err != nil {
		return err
	}
	// Registered after the daemon, so the pool closes before the daemon
	// unmounts its projection (as in esfd).
	e.Cleanup(func() error { return pex.ClosePool(context.Background()) })
	bundle, err := writeBareBundle(rig.dir, rig.rootfs)
	if err != nil {
		return err
	}
	bare := &gorunc.Runc{Root: filepath.Join(rig.dir, "bare-root")}
	seq := 0
	bareRun := func(ctx context.Context) (bench.Measurement, error) {
		seq++
		return bench.Timed(1, func() error {
			status, err := bare.Run(ctx, fmt.Sprintf("bare-%d", seq), bundle, &gorunc.CreateOpts{})
			if err == nil && status != 0 {
				err = fmt.Errorf("runc run: exit %d", status)
			}
			return err
		})
	}
	first := func(ctx context.Context) (bench.Measurement, error) {
		return activateAndRun(ctx, d, node, fabric.ExecutorRunc, fabric.ExecRequest{Args: []string{"true"}})
	}
	waitIdle := func() error {
		deadline := time.Now().Add(time.Minute)
		for pex.PoolIdle() < runcPool {
			if time.Now().After(deadline) {
				return errors.New("the runc pool never refilled")
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}
	// A warm activation finds the pool refilled: the refill (a runc run
	// in the background) is waited for, untimed.
	pooled := func(ctx context.Context) (bench.Measurement, error) {
		if err := waitIdle(); err != nil {
			return bench.Measurement{}, err
		}
		before := pex.PoolAdopted()
		m, err := activateAndRun(ctx, pd, pnode, fabric.ExecutorRunc, fabric.ExecRequest{Args: []string{"true"}})
		if err == nil && pex.PoolAdopted() != before+1 {
			err = errors.New("the activation did not adopt a pool container")
		}
		return m, err
	}
	// Parts of the pooled row: the activation alone (journal, overlay
	// mount, adoption), and the executor alone (adoption + first exec on
	// a plain directory, no esf around it).
	activateOnly := func(ctx context.Context) (bench.Measurement, error) {
		if err := waitIdle(); err != nil {
			return bench.Measurement{}, err
		}
		var aid string
		m, err := bench.Timed(1, func() error {
			a, err := pd.Ops.ActivateAttempt(ctx, fabric.ActivateRequest{NodeID: pnode, Executor: fabric.ExecutorRunc})
			aid = a.AttemptID
			return err
		})
		if aid != "" {
			err = errors.Join(err, pd.Ops.Release(ctx, aid))
		}
		return m, err
	}
	adoptSeq := 0
	executorOnly := func(ctx context.Context) (bench.Measurement, error) {
		if err := waitIdle(); err != nil {
			return bench.Measurement{}, err
		}
		adoptSeq++
		id := fmt.Sprintf("adopt-%d", adoptSeq)
		m, err := bench.Timed(1, func() error {
			if err := pex.Start(ctx, id, executor.Spec{Rootfs: rig.rootfs}); err != nil {
				return err
			}
			return execTrue(ctx, pex, id)
		})
		return m, errors.Join(err, pex.Stop(ctx, id))
	}
	// Parts of the cold row: the executor alone (runc run -d, then the
	// first exec, which waits for its spare's move into its exec cgroup),
	// and one such move after an idle spell.
	coldSeq := 0
	coldOnly := func(ctx context.Context) (bench.Measurement, error) {
		coldSeq++
		id := fmt.Sprintf("cold-%d", coldSeq)
		m, err := bench.Timed(1, func() error {
			if err := ex.Start(ctx, id, executor.Spec{Rootfs: rig.rootfs}); err != nil {
				return err
			}
			return execTrue(ctx, ex, id)
		})
		return m, errors.Join(err, ex.Stop(ctx, id))
	}
	move, err := newCgroupMove(e)
	if err != nil {
		return err
	}
	if _, err := bench.Interleave(ctx, 1, pooled, first, bareRun, activateOnly, executorOnly, coldOnly, move); err != nil { // warm-up
		return err
	}
	ms, err := bench.Interleave(ctx, e.Size(5, 10), pooled, first, bareRun, activateOnly, executorOnly, coldOnly, move)
	if err != nil {
		return err
	}
	warm, act, run := bench.Latencies(ms[0]), bench.Latencies(ms[1]), bench.Latencies(ms[2])
	actOnly, exOnly := bench.Latencies(ms[3]), bench.Latencies(ms[4])
	coldEx, mv := bench.Latencies(ms[5]), bench.Latencies(ms[6])
	e.Add(bench.Row{Name: "part: runc cold start + first exec, executor alone", Value: coldEx.P50, Unit: "ms", P90: coldEx.P90, N: coldEx.N, Samples: coldEx.Values,
		Baseline: "bare runc run", BaselineValue: run.P50, Path: "direct",
		Note: "runc.Executor Start (runc run -d) on a plain directory + exec true, no esf around it; the exec waits for its spare's cgroup move"})
	e.Add(bench.Row{Name: "part: one process moved into a new cgroup after an idle spell", Value: mv.P50, Unit: "ms", P90: mv.P90, N: mv.N, Samples: mv.Values,
		Baseline: "bare runc run", BaselineValue: run.P50, Path: "direct",
		Note: "a write of a sleeping process's pid into cgroup.procs 50 ms after the last move: an RCU grace period (cgroup_threadgroup_rwsem without favordynmods), which every exec's move into its exec cgroup waits for once"})
	e.Add(bench.Row{Name: "part: runc activate alone, pooled", Value: actOnly.P50, Unit: "ms", P90: actOnly.P90, N: actOnly.N, Samples: actOnly.Values,
		Baseline: "bare runc run", BaselineValue: run.P50, Path: pd.Ops.Path("activate"),
		Note: "the pooled row without its exec: activation record, overlay mount, adoption"})
	e.Add(bench.Row{Name: "part: runc adopt + first exec, executor alone", Value: exOnly.P50, Unit: "ms", P90: exOnly.P90, N: exOnly.N, Samples: exOnly.Values,
		Baseline: "bare runc run", BaselineValue: run.P50, Path: "direct",
		Note: "runc.Executor Start adopting a pool container on a plain directory + exec true, no esf around it"})
	e.Add(bench.Row{Name: rowName, Value: warm.P50, Unit: "ms", P90: warm.P90, N: warm.N, Samples: warm.Values,
		Baseline: "bare runc run", BaselineValue: run.P50, Targets: []bench.Target{bench.RatioAtMost(0.3)}, Path: pd.Ops.Path("activate"),
		Note: "activate --executor runc adopting a pre-started container of the pool (esfd --runc-pool 2; its root switched to the attempt's overlay, limits set) + exec true through the API, busybox rootfs; the pool's refill (started once the first exec ended) is waited for, untimed; baseline: runc run of true in the same rootfs and default spec"})
	e.Add(bench.Row{Name: rowName + ", no pool", Value: act.P50, Unit: "ms", P90: act.P90, N: act.N, Samples: act.Values,
		Baseline: "bare runc run", BaselineValue: run.P50, Targets: []bench.Target{bench.RatioAtMost(1.3)}, Path: d.Ops.Path("activate"),
		Note: "activate --executor runc (overlay + runc run of the init, detached) + exec true through the API, busybox rootfs; baseline: runc run of true in the same rootfs and default spec"})

	// Exec round trip in one running container.
	a, err := d.Ops.ActivateAttempt(ctx, fabric.ActivateRequest{NodeID: node, Executor: fabric.ExecutorRunc})
	if err != nil {
		return err
	}
	e.Cleanup(func() error { return d.Ops.Release(context.Background(), a.AttemptID) })
	viaAPI := func(ctx context.Context) (bench.Measurement, error) {
		return bench.Timed(1, func() error {
			return d.Ops.Exec(ctx, fabric.ExecRequest{AttemptID: a.AttemptID, Args: []string{"true"}})
		})
	}
	direct := func(ctx context.Context) (bench.Measurement, error) {
		return bench.Timed(1, func() error { return execTrue(ctx, ex, a.AttemptID) })
	}
	ms, err = bench.Interleave(ctx, e.Size(10, 30), viaAPI, direct)
	if err != nil {
		return err
	}
	api, alone := bench.Latencies(ms[0]), bench.Latencies(ms[1])
	e.Add(bench.Row{Name: "runc exec round trip", Value: api.P50, Unit: "ms", P90: api.P90, N: api.N, Samples: api.Values,
		Baseline: "the executor's Exec alone", BaselineValue: alone.P50, Path: d.Ops.Path("exec"),
		Note: "exec true in a running attempt: started by the container's init (no runc exec), output streamed back"})
	return nil
}

// newCgroupMove returns a bench step that moves a sleeping process into a
// new cgroup (freezer under v1, the unified root under v2) after an idle
// spell, timing the write alone; everything goes at the scenario's end.
func newCgroupMove(e *bench.Env) (func(context.Context) (bench.Measurement, error), error) {
	root := "/sys/fs/cgroup/freezer"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		root = "/sys/fs/cgroup"
	}
	base := filepath.Join(root, fmt.Sprintf("esf-bench-move-%d", os.Getpid()))
	if err := os.Mkdir(base, 0o755); err != nil {
		return nil, err
	}
	e.Cleanup(func() error { return os.Remove(base) })
	sleep := exec.Command("sleep", "3600")
	if err := sleep.Start(); err != nil {
		return nil, err
	}
	e.Cleanup(func() error {
		sleep.Process.Kill()
		sleep.Wait()
		return nil
	})
	pid := []byte(fmt.Sprint(sleep.Process.Pid))
	seq := 0
	return func(context.Context) (bench.Measurement, error) {
		seq++
		dir := filepath.Join(base, fmt.Sprint(seq))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return bench.Measurement{}, err
		}
		defer os.Remove(dir)
		// Spacing, not synchronisation: the last move's grace period has
		// passed, as between two execs of a rollout.
		time.Sleep(50 * time.Millisecond)
		m, err := bench.Timed(1, func() error { return os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0) })
		// Back to where it came from, so that the cgroup can go.
		return m, errors.Join(err, os.WriteFile(filepath.Join(root, "cgroup.procs"), pid, 0))
	}, nil
}
