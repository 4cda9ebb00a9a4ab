package bench

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/internal/testenv"
)

var (
	flagFull    = flag.Bool("bench.full", false, "run the benchmark suite at full size (make bench)")
	flagQuick   = flag.Bool("bench.quick", false, "run the benchmark suite at quick size (make bench-quick)")
	flagRun     = flag.String("bench.run", "", "regexp selecting scenarios by name")
	flagOut     = flag.String("bench.out", "", "results file (default results.json, results-quick.json in quick mode)")
	flagMD      = flag.String("bench.md", "", "also write the Markdown table to this file")
	flagRoot    = flag.String("bench.root", "", "scratch root (default /var/tmp/esf-bench-<pid>)")
	flagKeep    = flag.Bool("bench.keep", false, "keep the scratch root")
	flagProfile = flag.String("bench.profile", "", "directory for per-scenario CPU profiles")
	flagLogs    = flag.String("bench.logs", "", "directory for the daemons' logs")
	flagTrace   = flag.String("bench.trace", "", "directory for per-scenario execution traces (large: select one scenario)")
	flagFabric  = flag.Bool("bench.fabric", false, "call graph and attempt operations as Fabric methods, not through the API")
)

// The test binary doubles as the helper processes (projection server,
// go-fuse loopback): see RunRole.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == RoleArg {
		os.Exit(RunRole(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// TestBench runs the suite; `make bench` and `make bench-quick` pass its
// flag, plain `go test` skips it.
func TestBench(t *testing.T) {
	if !*flagFull && !*flagQuick {
		t.Skip("benchmarks run with -bench.full or -bench.quick (make bench, make bench-quick)")
	}
	testenv.Require(t, "root", "fuse", "overlay")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Quick: !*flagFull, Root: *flagRoot, Keep: *flagKeep, SelfCommand: []string{exe, RoleArg}, ViaFabric: *flagFabric,
		Logf: func(format string, args ...any) {
			fmt.Printf("%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
		},
	}
	if *flagRun != "" {
		cfg.Only = regexp.MustCompile(*flagRun)
	}
	for _, dir := range []*string{flagProfile, flagLogs, flagTrace} {
		if *dir == "" {
			continue
		}
		abs, err := filepath.Abs(*dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(abs, 0o755); err != nil {
			t.Fatal(err)
		}
		*dir = abs
	}
	cfg.ProfileDir, cfg.LogDir, cfg.TraceDir = *flagProfile, *flagLogs, *flagTrace
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println()
	fmt.Println(res.Table())
	out := *flagOut
	if out == "" {
		out = "results.json"
		if cfg.Quick {
			out = "results-quick.json"
		}
	}
	if err := res.WriteJSON(out); err != nil {
		t.Fatal(err)
	}
	if *flagMD != "" {
		if err := os.WriteFile(*flagMD, []byte(res.Markdown()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %s", out)
	// Missed targets are findings, reported in the table; a run that could
	// not measure is a failure.
	for _, r := range res.Rows {
		if r.Verdict == VerdictError {
			t.Errorf("%s: %s", r.Name, r.Note)
		}
	}
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		in       []float64
		p50, p90 float64
	}{
		{[]float64{5}, 5, 5},
		{[]float64{3, 1, 2}, 2, 2.8},
		{[]float64{4, 1, 3, 2}, 2.5, 3.7},
		{[]float64{10, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 5.5, 9.1},
	} {
		s := Summarize(tc.in)
		if math.Abs(s.P50-tc.p50) > 1e-9 || math.Abs(s.P90-tc.p90) > 1e-9 || s.N != len(tc.in) {
			t.Errorf("Summarize(%v) = %+v, want p50 %v p90 %v", tc.in, s, tc.p50, tc.p90)
		}
	}
	if s := Summarize(nil); !math.IsNaN(s.P50) || s.N != 0 {
		t.Errorf("Summarize(nil) = %+v", s)
	}
	in := []float64{3, 1, 2}
	Summarize(in)
	if in[0] != 3 || in[1] != 1 {
		t.Errorf("Summarize modified its input: %v", in)
	}
}

func TestJudge(t *testing.T) {
	for _, tc := range []struct {
		name string
		row  Row
		want string
	}{
		{"latency under", Row{Value: 0.8, Targets: []Target{AtMost(1)}}, VerdictPass},
		{"latency over", Row{Value: 1.2, Targets: []Target{AtMost(1)}}, VerdictFail},
		{"ratio under", Row{Value: 1.1, BaselineValue: 1, Targets: []Target{RatioAtMost(1.2)}}, VerdictPass},
		{"ratio over", Row{Value: 1.3, BaselineValue: 1, Targets: []Target{RatioAtMost(1.2)}}, VerdictFail},
		{"throughput ratio", Row{Value: 90, BaselineValue: 100, Targets: []Target{RatioAtLeast(0.9)}}, VerdictPass},
		{"throughput ratio low", Row{Value: 89, BaselineValue: 100, Targets: []Target{RatioAtLeast(0.9)}}, VerdictFail},
		{"all must hold", Row{Value: 0.9, BaselineValue: 0.5, Targets: []Target{AtMost(1), RatioAtMost(1.5)}}, VerdictFail},
		{"ratio without baseline", Row{Value: 1, Targets: []Target{RatioAtMost(2)}}, VerdictFail},
		{"zero objects", Row{Value: 0, Targets: []Target{AtMost(0)}}, VerdictPass},
		{"no target", Row{Value: 3, BaselineValue: 2}, ""},
		{"todo stays", Row{Verdict: VerdictTODO, Targets: []Target{AtMost(1)}}, VerdictTODO},
	} {
		r := tc.row
		r.judge()
		if r.Verdict != tc.want {
			t.Errorf("%s: verdict %q, want %q", tc.name, r.Verdict, tc.want)
		}
		if tc.row.BaselineValue != 0 && math.Abs(r.Ratio-tc.row.Value/tc.row.BaselineValue) > 1e-12 {
			t.Errorf("%s: ratio %v", tc.name, r.Ratio)
		}
	}
}

func TestInterleaveRotates(t *testing.T) {
	var order []string
	subject := func(name string) Subject {
		return func(context.Context) (Measurement, error) {
			order = append(order, name)
			return Measurement{Elapsed: time.Millisecond, Work: 1}, nil
		}
	}
	ms, err := Interleave(context.Background(), 3, subject("a"), subject("b"), subject("c"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(order, ""), "abcbcacab"; got != want {
		t.Errorf("order %s, want %s", got, want)
	}
	for i, m := range ms {
		if len(m) != 3 {
			t.Errorf("subject %d: %d measurements", i, len(m))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Interleave(ctx, 3, subject("a")); err == nil {
		t.Error("Interleave ran with a cancelled context")
	}
}

func TestRates(t *testing.T) {
	ms := []Measurement{{Elapsed: time.Second, Work: 2 << 20}, {Elapsed: 2 * time.Second, Work: 2 << 20}, {Elapsed: time.Second / 2, Work: 2 << 20}}
	if s := Rates(ms, mib); s.P50 != 2 {
		t.Errorf("rate p50 %v MiB/s, want 2", s.P50)
	}
	if s := Latencies(ms); s.P50 != 1000 {
		t.Errorf("latency p50 %v ms, want 1000", s.P50)
	}
}

func TestTreeLayout(t *testing.T) {
	dir := t.TempDir()
	const n = 250
	total, err := writeTree(context.Background(), dir, n, 3)
	if err != nil {
		t.Fatal(err)
	}
	got, err := countFiles(dir)
	if err != nil || got != n {
		t.Fatalf("countFiles = %d, %v; want %d", got, err, n)
	}
	var sum int64
	for _, p := range TreePaths(n) {
		st, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > smallFileMax {
			t.Errorf("%s: %d bytes", p, st.Size())
		}
		sum += st.Size()
	}
	if sum != total {
		t.Errorf("sizes add to %d, writeTree said %d", sum, total)
	}
	if treePath(0) != "p000/d00/f00.txt" || treePath(3299) != "p001/d00/f99.txt" {
		t.Errorf("layout changed: %s %s", treePath(0), treePath(3299))
	}
	// Same seed, same bytes: re-imports of a regenerated tree dedupe.
	dir2 := t.TempDir()
	if _, err := writeTree(context.Background(), dir2, 3, 3); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(dir, treePath(2)))
	b, _ := os.ReadFile(filepath.Join(dir2, treePath(2)))
	if string(a) != string(b) {
		t.Error("writeTree is not deterministic for a seed")
	}
}

func TestReport(t *testing.T) {
	res := &Results{Machine: Machine{Mode: "quick", StateFS: "ext4"}, Rows: []Row{
		{Name: "fork", Value: 0.5, Unit: "ms", P90: 0.7, Baseline: "fdatasync", BaselineValue: 0.25, Targets: []Target{AtMost(1)}},
		{Name: "warm read", Value: 900, Unit: "MiB/s", Baseline: "native", BaselineValue: 1000, Targets: []Target{RatioAtLeast(0.9)}},
		{Name: "runc", Verdict: VerdictTODO, Note: "not built | yet"},
	}}
	for i := range res.Rows {
		res.Rows[i].judge()
	}
	tab := res.Table()
	for _, want := range []string{"fork", "0.5", "0.7", "fdatasync", "≤1 ms", "pass", "ratio ≥0.9", "todo", "not built"} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
	if !strings.Contains(tab, "2  ") { // ratio of the fork row
		t.Errorf("table lacks the fork ratio 2:\n%s", tab)
	}
	md := res.Markdown()
	if !strings.Contains(md, "| fork | 0.5 | ms | 0.7 | fdatasync | 0.25 | 2 | ≤1 ms | pass |") {
		t.Errorf("markdown row:\n%s", md)
	}
	p := filepath.Join(t.TempDir(), "r.json")
	if err := res.WriteJSON(p); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	for _, want := range []string{`"baseline_value": 0.25`, `"ratio": 2`, `"state_fs": "ext4"`, `"verdict": "todo"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("results.json lacks %s:\n%s", want, b)
		}
	}
}

func TestRegistry(t *testing.T) {
	names := map[string]bool{}
	last := math.MinInt
	for _, s := range scenarios() {
		if s.Order < last {
			t.Errorf("scenarios out of order at %s", s.Name)
		}
		last = s.Order
		names[s.Name] = true
	}
	for _, want := range []string{"graph", "import", "export", "fork", "activate", "seal", "breakdown", "io", "wasi", "runc"} {
		if !names[want] {
			t.Errorf("scenario %s not registered", want)
		}
	}
}
