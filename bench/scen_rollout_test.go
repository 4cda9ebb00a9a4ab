package bench_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/fabric"
)

// Rollout throughput (issue 21, target 7): what an RL coordinator does
// with a runc sandbox per episode, many at once. Each of 16 clients (its
// own API connection) runs rollouts in a row: activate (runc) → exec a
// command → suspend (seal the attempt's delta, which releases it). The
// baseline is 16 concurrent bare `runc run`s of the same command in the
// same rootfs and default spec, which seal nothing. Both are rates
// (rollouts or runs per second of the whole batch), interleaved.

func init() {
	bench.Register(bench.Scenario{Name: "rollout", Order: 76, Run: benchRollout})
}

// rolloutClients is the number of concurrent clients of the rollout rows.
const rolloutClients = 16

// rolloutArgs is the command of a rollout and of its bare baseline: it
// writes a result, so the seal has a delta to store.
var rolloutArgs = []string{"/bin/sh", "-c", "echo done > /result"}

func benchRollout(ctx context.Context, e *bench.Env) error {
	const rowName = "rollouts/s, 16 concurrent clients"
	rig, err := newRuncRig(e, "rollout", rowName)
	if rig == nil || err != nil {
		return err
	}
	d, node, _, err := rig.daemon(ctx, "rollout", runc.Options{Namespace: "esf-bench"}, nil)
	if err != nil {
		return err
	}
	// The same with a warm pool of one container per client (esfd
	// --runc-pool 16), in a daemon of its own.
	pd, pnode, pex, err := rig.daemon(ctx, "rollout-pool", runc.Options{Namespace: "esf-bench-rollout-pool", PoolSize: rolloutClients}, nil)
	if err != nil {
		return err
	}
	// Registered after the daemon, so the pool closes before the daemon
	// unmounts its projection (as in esfd).
	e.Cleanup(func() error { return pex.ClosePool(context.Background()) })
	dir := rig.dir
	bundle, err := writeBundleArgs(dir, rig.rootfs, "rollout-bundle", rolloutArgs)
	if err != nil {
		return err
	}
	bare := &gorunc.Runc{Root: filepath.Join(dir, "bare-root")}
	type target struct {
		node    string
		clients []*bench.Ops
	}
	cold, pooled := target{node: node}, target{node: pnode}
	for range rolloutClients {
		cold.clients = append(cold.clients, d.NewOps())
		pooled.clients = append(pooled.clients, pd.NewOps())
	}
	perClient := e.Size(1, 4)
	var seq atomic.Int64
	// The phases of every measured rollout, per subject (pooled, cold),
	// for the part: rows.
	var phaseMu sync.Mutex
	var phases [2][3][]time.Duration // activate, exec, suspend
	timePhase := func(k, i int, fn func() error) error {
		start := time.Now()
		err := fn()
		phaseMu.Lock()
		phases[k][i] = append(phases[k][i], time.Since(start))
		phaseMu.Unlock()
		return err
	}
	rollout := func(k int, t target) func(context.Context, int) error {
		return func(ctx context.Context, c int) error {
			o := t.clients[c]
			var a fabric.AttemptView
			err := timePhase(k, 0, func() (err error) {
				a, err = o.ActivateAttempt(ctx, fabric.ActivateRequest{NodeID: t.node, Executor: fabric.ExecutorRunc})
				return err
			})
			if err != nil {
				return err
			}
			if err := timePhase(k, 1, func() error {
				return o.Exec(ctx, fabric.ExecRequest{AttemptID: a.AttemptID, Args: rolloutArgs})
			}); err != nil {
				return fmt.Errorf("%w (and %v)", err, o.Release(context.WithoutCancel(ctx), a.AttemptID))
			}
			return timePhase(k, 2, func() error { _, err := o.Suspend(ctx, a.AttemptID); return err })
		}
	}
	bareRun := func(ctx context.Context, _ int) error {
		status, err := bare.Run(ctx, fmt.Sprintf("rollout-bare-%d", seq.Add(1)), bundle, &gorunc.CreateOpts{})
		if err == nil && status != 0 {
			err = fmt.Errorf("runc run: exit %d", status)
		}
		return err
	}
	// The pool is full before every measurement (untimed), and a pooled
	// batch ends only when it is full again: the refills (a runc run -d
	// each, started as the batch adopts) are the batch's work too, as in
	// a daemon that keeps serving. served[i] is when its rollouts alone
	// had ended.
	waitFull := func() error {
		deadline := time.Now().Add(2 * time.Minute)
		for pex.PoolIdle() < rolloutClients {
			if time.Now().After(deadline) {
				return fmt.Errorf("the runc pool never refilled (%d idle)", pex.PoolIdle())
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}
	var served []time.Duration
	// adoptedShare: per pooled batch, the share of its activations that
	// adopted a pool container (the others found the pool empty and ran
	// runc run -d themselves, as without a pool).
	var adoptedShare []float64
	// cpu[k]: CPU time of this process and of the children it waited for
	// (runc, and through a bare runc run its container), per measurement
	// of subject k.
	cpu := make([][]time.Duration, 3)
	// idle[k]: CPUs of the machine left idle while a batch of subject k
	// ran (all tenants counted).
	idle := make([][]float64, 3)
	// busy[k]: CPU time the whole machine spent (every process, the
	// containers' and other tenants' included) per measurement of k.
	busy := make([][]time.Duration, 3)
	batch := func(k int, op func(context.Context, int) error) bench.Subject {
		return func(ctx context.Context) (bench.Measurement, error) {
			if err := waitFull(); err != nil {
				return bench.Measurement{}, err
			}
			adopted := pex.PoolAdopted()
			cpu0 := selfAndChildrenCPU()
			idle0, total0 := machineCPUTicks()
			start := time.Now()
			defer func() {
				cpu[k] = append(cpu[k], selfAndChildrenCPU()-cpu0)
				if idle1, total1 := machineCPUTicks(); total1 > total0 {
					idleFrac := float64(idle1-idle0) / float64(total1-total0)
					idle[k] = append(idle[k], idleFrac*float64(runtime.NumCPU()))
					busy[k] = append(busy[k], time.Duration((1-idleFrac)*float64(runtime.NumCPU())*float64(time.Since(start))))
				}
			}()
			return bench.Timed(float64(rolloutClients*perClient), func() error {
				var wg sync.WaitGroup
				errs := make([]error, rolloutClients)
				for c := range rolloutClients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range perClient {
							if errs[c] = op(ctx, c); errs[c] != nil {
								return
							}
						}
					}()
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					return err
				}
				if k != 0 {
					return nil
				}
				served = append(served, time.Since(start))
				n := pex.PoolAdopted() - adopted
				adoptedShare = append(adoptedShare, float64(n)/float64(rolloutClients*perClient))
				if n < rolloutClients {
					return fmt.Errorf("only %d pooled activations adopted a pool container, want one per client at least", n)
				}
				return waitFull()
			})
		}
	}
	subjects := []bench.Subject{batch(0, rollout(0, pooled)), batch(1, rollout(1, cold)), batch(2, bareRun)}
	// Warm up with one of each (page cache, runc's binary, the
	// projection), not a batch: bench-quick has 5 minutes in all.
	if err := waitFull(); err != nil {
		return err
	}
	for _, op := range []func(context.Context, int) error{rollout(0, pooled), rollout(1, cold), bareRun} {
		if err := op(ctx, 0); err != nil {
			return err
		}
	}
	phases, cpu, idle, busy, adoptedShare = [2][3][]time.Duration{}, [][]time.Duration{nil, nil, nil}, [][]float64{nil, nil, nil}, [][]time.Duration{nil, nil, nil}, nil
	ms, err := bench.Interleave(ctx, e.Size(3, 5), subjects...)
	if err != nil {
		return err
	}
	n := float64(rolloutClients * perClient)
	r, c, b := bench.Rates(ms[0], 1), bench.Rates(ms[1], 1), bench.Rates(ms[2], 1)
	note := fmt.Sprintf("%d clients (one API connection each) at once, %d rollouts each in a row: activate --executor runc + exec %q + suspend (seal, release), busybox rootfs; baseline: as many runc runs of the same command, 16 at once, same rootfs and default spec, sealing nothing",
		rolloutClients, perClient, rolloutArgs)
	e.Add(bench.Row{Name: rowName, Value: r.P50, Unit: "rollouts/s", P90: r.P90, N: r.N, Samples: r.Values,
		Baseline: "16 concurrent bare runc runs", BaselineValue: b.P50, Targets: []bench.Target{bench.RatioAtLeast(1)}, Path: pd.Ops.Path("activate"),
		Note: note + fmt.Sprintf("; activations adopt containers of a warm pool (esfd --runc-pool %d), full before each batch, and a batch ends when the pool is full again (its refills, a runc run -d per rollout, are counted)", rolloutClients)})
	e.Add(bench.Row{Name: rowName + ", no pool", Value: c.P50, Unit: "rollouts/s", P90: c.P90, N: c.N, Samples: c.Values,
		Baseline: "16 concurrent bare runc runs", BaselineValue: b.P50, Targets: []bench.Target{bench.RatioAtLeast(1)}, Path: d.Ops.Path("activate"),
		Note: note + "; every activation runs runc run -d"})
	sv := make([]float64, len(served))
	for i, d := range served {
		sv[i] = n / d.Seconds()
	}
	s := bench.Summarize(sv)
	e.Add(bench.Row{Name: "part: rollouts/s, 16 clients, pooled, until the last rollout ended", Value: s.P50, Unit: "rollouts/s", P90: s.P90, N: s.N, Samples: s.Values,
		Baseline: "16 concurrent bare runc runs", BaselineValue: b.P50, Path: pd.Ops.Path("activate"),
		Note: "the pooled row's batches without the wait for the pool's last refills: what the clients saw"})
	as := bench.Summarize(adoptedShare)
	e.Add(bench.Row{Name: "part: share of pooled activations that adopted a pool container", Value: as.P50, Unit: "ratio", P90: as.P90, N: as.N, Samples: as.Values, Path: pd.Ops.Path("activate"),
		Note: "per pooled batch; the rest found the pool empty and ran runc run -d in the activation, as without a pool: the refills (at most one per CPU at a time, a runc run -d each) do not keep up with 16 clients"})
	perOp := func(ds []time.Duration) bench.Sample {
		xs := make([]float64, len(ds))
		for i, d := range ds {
			xs[i] = float64(d) / float64(time.Millisecond) / n
		}
		return bench.Summarize(xs)
	}
	bc := perOp(cpu[2])
	for k, suffix := range []string{"", ", no pool", ", bare runc runs"} {
		is := bench.Summarize(idle[k])
		e.Add(bench.Row{Name: "part: idle CPUs of the machine during the batches" + suffix, Value: is.P50, Unit: "CPUs", P90: is.P90, N: is.N, Samples: is.Values, Path: d.Ops.Path("activate"),
			Note: "idle and iowait time of all the machine's CPUs (/proc/stat) over a batch's elapsed time, every tenant counted: near 0, the CPUs were all busy and the rate is the share of them the batch got; well above 0 with a rate below its target, the rollouts wait on something else"})
	}
	bb := perOp(busy[2])
	for k, suffix := range []string{"", ", no pool"} {
		mb := perOp(busy[k])
		e.Add(bench.Row{Name: "part: machine CPU time per rollout, 16 clients" + suffix, Value: mb.P50, Unit: "ms", P90: mb.P90, N: mb.N, Samples: mb.Values,
			Baseline: "per bare runc run", BaselineValue: bb.P50, Path: d.Ops.Path("activate"),
			Note: "busy time of all the machine's CPUs (/proc/stat) over a batch, per rollout: every process counted (clients, daemon, projection, runc, the containers, other tenants); with no idle CPU left, the rows' ratio is about the inverse of this one"})
	}
	for k, suffix := range []string{"", ", no pool"} {
		rc := perOp(cpu[k])
		e.Add(bench.Row{Name: "part: CPU time per rollout, 16 clients" + suffix, Value: rc.P50, Unit: "ms", P90: rc.P90, N: rc.N, Samples: rc.Values,
			Baseline: "per bare runc run", BaselineValue: bc.P50, Path: d.Ops.Path("activate"),
			Note: "user + system CPU time of this process (clients, daemon) and of the children it waited for (runc run -d of a pool refill or a cold activation; a bare runc run and its container), per rollout; the container's own processes of a rollout are not counted"})
		for i, name := range []string{"activate", "exec", "suspend"} {
			xs := make([]float64, len(phases[k][i]))
			for j, d := range phases[k][i] {
				xs[j] = float64(d) / float64(time.Millisecond)
			}
			p := bench.Summarize(xs)
			e.Add(bench.Row{Name: "part: rollout phase, 16 clients: " + name + suffix, Value: p.P50, Unit: "ms", P90: p.P90, N: p.N, Samples: p.Values, Path: d.Ops.Path("activate"),
				Note: "latency of this phase of the measured rollouts, 16 running at once"})
		}
	}
	return nil
}

// machineCPUTicks reads the machine's idle (idle + iowait) and total CPU
// time from /proc/stat, in clock ticks; zeros if it cannot.
func machineCPUTicks() (idle, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, 0
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0
		}
		if i >= 8 { // guest and guest_nice are counted in user and nice
			break
		}
		total += v
		if i == 3 || i == 4 {
			idle += v
		}
	}
	return idle, total
}

// selfAndChildrenCPU is the user + system CPU time of this process and of
// the children it has waited for.
func selfAndChildrenCPU() time.Duration {
	var sum time.Duration
	for _, who := range []int{unix.RUSAGE_SELF, unix.RUSAGE_CHILDREN} {
		var ru unix.Rusage
		if unix.Getrusage(who, &ru) == nil {
			sum += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return sum
}

// writeBundleArgs writes a bundle like writeBareBundle's that runs args,
// into dir/name.
func writeBundleArgs(dir, rootfs, name string, args []string) (string, error) {
	tmp, err := os.MkdirTemp(dir, name+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src, err := writeBareBundle(tmp, rootfs)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return "", err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", err
	}
	proc, _ := spec["process"].(map[string]any)
	if proc == nil {
		return "", fmt.Errorf("bundle spec has no process")
	}
	proc["args"] = args
	// Concurrent runs of one bundle must not share its cgroup (the
	// generated spec names /<namespace>/bare): each runc run would remove
	// it at exit under the others, which fail now and then. Without a
	// path, runc gives each container /<its id>, as esf gives each attempt.
	if linux, ok := spec["linux"].(map[string]any); ok {
		delete(linux, "cgroupsPath")
	}
	if b, err = json.Marshal(spec); err != nil {
		return "", err
	}
	bundle := filepath.Join(dir, name)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return "", err
	}
	return bundle, os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
}
