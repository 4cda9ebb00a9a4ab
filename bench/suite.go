package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Row is one line of the results: a measured value, optionally beside the
// baseline it was measured against in the same run, and the targets of
// issue 8 it is judged by.
type Row struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// P90 is the 90th percentile of the samples, for latency rows (for
	// throughput rows it is the 90th percentile of the throughputs).
	P90 float64 `json:"p90,omitempty"`
	// N is the number of samples the median is of; Samples are their
	// values in the order they were taken (JSON only).
	N       int       `json:"n,omitempty"`
	Samples []float64 `json:"samples,omitempty"`
	// Baseline names what Value is compared with; BaselineValue is its
	// median in the same run, in the same unit. Ratio is always
	// Value / BaselineValue: for a latency lower is better, for a
	// throughput higher is.
	Baseline      string  `json:"baseline,omitempty"`
	BaselineValue float64 `json:"baseline_value,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`
	// Targets are the bounds; the row passes when all hold.
	Targets []Target `json:"targets,omitempty"`
	// Verdict is pass, FAIL, todo, skip or error; empty for rows with no
	// target (information).
	Verdict string `json:"verdict,omitempty"`
	// Path says how the subject was driven: "api" (a Go client.Client over the
	// unix socket, as esfctl does), "fabric" (the Go method, no transport)
	// or "fs" (system calls on a mounted directory).
	Path string `json:"path,omitempty"`
	Note string `json:"note,omitempty"`
}

// Target is one bound of issue 8 on a row's value or its ratio.
type Target struct {
	Of    string  `json:"of"` // "value" or "ratio"
	Op    string  `json:"op"` // "<=" or ">="
	Limit float64 `json:"limit"`
}

// AtMost bounds the value from above (latencies, in the row's unit).
func AtMost(limit float64) Target { return Target{Of: "value", Op: "<=", Limit: limit} }

// AtLeast bounds the value from below (throughputs).
func AtLeast(limit float64) Target { return Target{Of: "value", Op: ">=", Limit: limit} }

// RatioAtMost bounds Value/BaselineValue from above.
func RatioAtMost(limit float64) Target { return Target{Of: "ratio", Op: "<=", Limit: limit} }

// RatioAtLeast bounds Value/BaselineValue from below.
func RatioAtLeast(limit float64) Target { return Target{Of: "ratio", Op: ">=", Limit: limit} }

// Met reports whether r satisfies t. A ratio target on a row without a
// baseline is not met: the comparison it asks for was not made.
func (t Target) Met(r Row) bool {
	v := r.Value
	if t.Of == "ratio" {
		if r.BaselineValue == 0 {
			return false
		}
		v = r.Ratio
	}
	if math.IsNaN(v) {
		return false
	}
	if t.Op == ">=" {
		return v >= t.Limit
	}
	return v <= t.Limit
}

// Format renders t for the table, e.g. "≤1 ms" or "ratio ≥0.9".
func (t Target) Format(unit string) string {
	op := "≤"
	if t.Op == ">=" {
		op = "≥"
	}
	if t.Of == "ratio" {
		return "ratio " + op + trimFloat(t.Limit)
	}
	return op + trimFloat(t.Limit) + " " + unit
}

// Verdicts of rows that were not measured.
const (
	VerdictPass  = "pass"
	VerdictFail  = "FAIL"
	VerdictTODO  = "todo"
	VerdictSkip  = "skip"
	VerdictError = "error"
)

// judge fills Ratio and Verdict from the measurements and targets.
func (r *Row) judge() {
	if r.BaselineValue != 0 && r.Ratio == 0 {
		r.Ratio = r.Value / r.BaselineValue
	}
	if r.Verdict != "" || len(r.Targets) == 0 {
		return
	}
	r.Verdict = VerdictPass
	for _, t := range r.Targets {
		if !t.Met(*r) {
			r.Verdict = VerdictFail
		}
	}
}

// Scenario is one family of rows. Other files of this package (and the
// runc_*.go and wasi_*.go files other engineers add) register theirs from
// an init function; the runner runs them in Order, then Name.
type Scenario struct {
	// Name is unique; TestBench's -bench.run selects scenarios by it.
	Name string
	// Order places the scenario in the run (built-in ones use 10..90).
	Order int
	// Replaces lists the TODO rows this scenario supersedes (see todoRows):
	// a registered "runc" scenario removes the runc TODO row.
	Replaces []string
	// Run measures and adds rows with Env.Add. An error is recorded as an
	// error row; the run goes on with the next scenario.
	Run func(ctx context.Context, e *Env) error
}

var (
	registryMu sync.Mutex
	registry   = map[string]Scenario{}
)

// Register adds s to the suite. It panics on a duplicate name or a nil
// Run: both are programming errors found at init time.
func Register(s Scenario) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if s.Name == "" || s.Run == nil {
		panic("bench: Register needs a name and a Run")
	}
	if _, dup := registry[s.Name]; dup {
		panic("bench: scenario " + s.Name + " registered twice")
	}
	registry[s.Name] = s
}

// scenarios returns the registered scenarios in run order.
func scenarios() []Scenario {
	registryMu.Lock()
	defer registryMu.Unlock()
	out := make([]Scenario, 0, len(registry))
	for _, s := range registry {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Order != out[j].Order {
			return out[i].Order < out[j].Order
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Sample is the summary of repeated measurements of one quantity.
type Sample struct {
	P50, P90 float64
	N        int
	Values   []float64 // as measured, in order
}

// Summarize returns the median and 90th percentile of xs (linear
// interpolation between closest ranks). It does not modify xs.
func Summarize(xs []float64) Sample {
	if len(xs) == 0 {
		return Sample{P50: math.NaN(), P90: math.NaN()}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return Sample{P50: quantile(s, 0.5), P90: quantile(s, 0.9), N: len(s), Values: slices.Clone(xs)}
}

// quantile of sorted s.
func quantile(s []float64, q float64) float64 {
	if len(s) == 1 {
		return s[0]
	}
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// Measurement is one timed run of a subject: the time it took and the
// amount of work it did (bytes, files, operations), from which rates come.
type Measurement struct {
	Elapsed time.Duration
	Work    float64
}

// Subject is something measured repeatedly: each call does the work once
// and reports what it did. Setup that must not be timed happens inside the
// call, outside the Measurement's Elapsed.
type Subject func(ctx context.Context) (Measurement, error)

// Interleave runs every subject reps times, round-robin, starting each
// round with a different subject, so that slow drifts of a shared machine
// (other tenants, writeback, compactions) spread over all of them instead
// of favouring whichever ran first. It returns the measurements per
// subject.
func Interleave(ctx context.Context, reps int, subjects ...Subject) ([][]Measurement, error) {
	out := make([][]Measurement, len(subjects))
	for rep := range reps {
		for k := range subjects {
			i := (rep + k) % len(subjects)
			if err := ctx.Err(); err != nil {
				return out, err
			}
			m, err := subjects[i](ctx)
			if err != nil {
				return out, err
			}
			out[i] = append(out[i], m)
		}
	}
	return out, nil
}

// Latencies summarizes the elapsed times of ms, in milliseconds.
func Latencies(ms []Measurement) Sample {
	xs := make([]float64, len(ms))
	for i, m := range ms {
		xs[i] = float64(m.Elapsed) / float64(time.Millisecond)
	}
	return Summarize(xs)
}

// Seconds summarizes the elapsed times of ms, in seconds.
func Seconds(ms []Measurement) Sample {
	xs := make([]float64, len(ms))
	for i, m := range ms {
		xs[i] = m.Elapsed.Seconds()
	}
	return Summarize(xs)
}

// Rates summarizes Work per second divided by scale (e.g. 1<<20 for MiB/s).
// The P90 of a rate is its 90th percentile, the fast side.
func Rates(ms []Measurement, scale float64) Sample {
	xs := make([]float64, len(ms))
	for i, m := range ms {
		xs[i] = m.Work / m.Elapsed.Seconds() / scale
	}
	return Summarize(xs)
}

// Timed runs fn and returns how long it took with work as its Work.
func Timed(work float64, fn func() error) (Measurement, error) {
	start := time.Now()
	err := fn()
	return Measurement{Elapsed: time.Since(start), Work: work}, err
}

// trimFloat formats v with up to 3 significant decimals and no trailing
// zeros.
func trimFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.1f", v), "0"), ".")
	case math.Abs(v) >= 0.01:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
	}
	return fmt.Sprintf("%.2g", v)
}
