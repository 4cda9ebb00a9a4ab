// Package bench is esf's benchmark suite (issue 8): every number that makes
// esf worth choosing, measured as a ratio against a baseline measured in
// the same run, on the same disk, interleaved with it.
//
// Running it: `make bench` (full sizes, writes bench/results.json) and
// `make bench-quick` (5k instead of 100k files, 256 MiB instead of 1 GiB,
// a 50k- instead of a 1M-node graph; writes bench/results-quick.json).
// Both are TestBench with a flag; plain `go test` skips it. It needs root
// (overlay and FUSE mounts, drop_caches).
//
// What a number means:
//   - Latencies are medians (p50) of many repetitions, with the p90 beside
//     them; throughputs are medians of a few. The machine is shared, so
//     subject and baseline run round-robin (Interleave), each round starting
//     with a different one.
//   - Graph and attempt operations go through Ops, which drives the daemon
//     as esfctl does: a client.Client over the unix socket of an api.Server
//     in this process, so every latency includes the HTTP round trip and
//     the JSON coding (path "api"). -bench.fabric calls the same operations
//     as Fabric methods instead (path "fabric"): the difference is what the
//     transport costs.
//   - The FUSE projection runs in a child process (this binary re-executed
//     with RoleArg, as esfd runs `esfd fuse-server`), and so does go-fuse's
//     stock loopback: a FUSE server must not serve the process that reads
//     its mount, and in-process serving would bill its CPU to the harness.
//   - Everything lives under /var/tmp/esf-bench-<pid> (Config.Root), not
//     /tmp: this machine's ext4 is slow to create files in directories with
//     many recent deletions, /tmp the worst. Outputs nothing synced are
//     deleted as soon as they are measured (cheap: not written back yet);
//     synced ones (import's stores and cp -a copies) stay until the run
//     ends, because deleting a written-back file costs about a millisecond
//     here (no journal, mounted discard: a synchronous discard per freed
//     extent) and would disturb the next measurements. Run removes the root
//     with parallel unlinks, every mount under it and every child it
//     started.
//
// Adding rows: register a Scenario from an init function, in this package
// or in package bench_test (then qualify the names: bench.Register,
// *bench.Env, ...), as scen_exec_test.go does for the runc and WASI rows:
// their fixtures are test helpers, so they live in a test file and start a
// private daemon with the executor (Env.StartDaemon's configure). Go
// benchmarks (func BenchmarkX, runc_test.go) still run with go test
// -bench, but only registered scenarios are rows of the table and of
// results.json.
//
//	func init() {
//		Register(Scenario{Name: "runc", Order: 70, Replaces: []string{"runc"}, Run: benchRunc})
//	}
//
//	func benchRunc(ctx context.Context, e *Env) error {
//		d, err := e.Main(ctx)            // the shared daemon: d.Ops, d.Client, d.Fabric
//		g, err := e.Group(ctx, dir)      // a group rooted at an imported directory (cached)
//		ms, err := Interleave(ctx, e.Size(10, 30), subject, baseline)
//		s, b := Latencies(ms[0]), Latencies(ms[1])
//		e.Add(Row{Name: "runc activate + first exec", Value: s.P50, Unit: "ms", P90: s.P90, N: s.N,
//			Baseline: "runc run", BaselineValue: b.P50, Targets: []Target{RatioAtMost(1.3)}, Path: "api"})
//		return nil
//	}
//
// Replaces names the TODO rows the scenario supersedes ("runc", "wasi",
// "gc"). A Subject does its untimed setup itself and times only the work
// (Timed); e.Cleanup registers teardown run when the scenario ends;
// e.Mkdir gives fresh scratch directories on the state dir's file system;
// e.StartDaemon a private daemon torn down with the scenario. Return an
// error only for a failure of the measurement itself: it becomes an error
// row and the run goes on.
//
// Concurrency: scenarios run one at a time on the test goroutine; an Env is
// not safe for concurrent use. Register is safe from init functions.
package bench
