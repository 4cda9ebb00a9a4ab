package bench_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/e2b"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/executor/runc/runctest"
	"github.com/esf-dev/esf/fabric"
)

// The E2B front door as the unmodified JavaScript SDK drives it: create +
// first command against esfctl's activate + exec of the same command on
// the same daemon, and fork(count=4). The SDK runs in one long-lived node
// process (e2e/e2bsdk/bench.mjs) that times each call itself, so node's
// start-up is not counted.

func init() {
	bench.Register(bench.Scenario{Name: "e2b", Order: 76, Replaces: []string{"e2b"}, Run: benchE2B})
}

func benchE2B(ctx context.Context, e *bench.Env) error {
	const rowName = "E2B SDK create + first run"
	skip := func(err error) error {
		e.Add(bench.Row{Name: rowName, Verdict: bench.VerdictSkip, Note: err.Error()})
		return nil
	}
	if err := runctest.Check(); err != nil {
		return skip(err)
	}
	bash, err := exec.LookPath("bash-static")
	if err != nil {
		return skip(err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		return skip(err)
	}
	suite, err := filepath.Abs(filepath.Join("..", "e2e", "e2bsdk"))
	if err != nil {
		return err
	}
	if err := npmCI(ctx, suite); err != nil {
		return skip(err)
	}
	rig, err := newRuncRig(e, "e2b", rowName)
	if rig == nil || err != nil {
		return err
	}
	dir := rig.dir
	b, err := os.ReadFile(bash)
	if err != nil {
		return err
	}
	os.Remove(filepath.Join(rig.rootfs, "bin", "bash"))
	if err := os.WriteFile(filepath.Join(rig.rootfs, "bin", "bash"), b, 0o755); err != nil {
		return err
	}
	d, node, _, err := rig.daemon(ctx, "e2b", runc.Options{Namespace: "esf-bench-e2b"}, nil)
	if err != nil {
		return err
	}
	const key = "e2b_0123456789abcdef0123456789abcdef"
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte(key+"\n"), 0o600); err != nil {
		return err
	}
	toks, err := api.LoadTokens(keys, nil)
	if err != nil {
		return err
	}
	front := e2b.New(d.Fabric, e2b.Options{Keys: toks, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(front)
	e.Cleanup(func() error { hs.CloseClientConnections(); hs.Close(); front.Close(); return nil })

	cmd := exec.CommandContext(ctx, "node", "bench.mjs")
	cmd.Dir = suite
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+key, "E2B_API_URL="+hs.URL, "E2B_SANDBOX_URL="+hs.URL,
		"ESF_E2B_TEMPLATE="+node)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return skip(err)
	}
	e.Cleanup(func() error { in.Close(); cmd.Wait(); return nil })
	out := bufio.NewScanner(outPipe)
	ask := func(what string) (bench.Measurement, error) {
		if _, err := io.WriteString(in, what+"\n"); err != nil {
			return bench.Measurement{}, err
		}
		if !out.Scan() {
			return bench.Measurement{}, fmt.Errorf("bench.mjs: no answer to %s: %v", what, out.Err())
		}
		line := out.Text()
		ms, err := strconv.ParseFloat(line, 64)
		if err != nil {
			return bench.Measurement{}, fmt.Errorf("bench.mjs %s: %s", what, strings.TrimPrefix(line, "error "))
		}
		return bench.Measurement{Elapsed: time.Duration(ms * float64(time.Millisecond)), Work: 1}, nil
	}
	sdk := func(ctx context.Context) (bench.Measurement, error) { return ask("create") }
	viaAPI := func(ctx context.Context) (bench.Measurement, error) {
		return activateAndRun(ctx, d, node, fabric.ExecutorRunc, fabric.ExecRequest{Args: []string{"/bin/bash", "-l", "-c", "true"}})
	}
	if _, err := bench.Interleave(ctx, 1, sdk, viaAPI); err != nil { // warm-up
		return err
	}
	ms, err := bench.Interleave(ctx, e.Size(5, 10), sdk, viaAPI)
	if err != nil {
		return err
	}
	s, a := bench.Latencies(ms[0]), bench.Latencies(ms[1])
	e.Add(bench.Row{Name: rowName, Value: s.P50, Unit: "ms", P90: s.P90, N: s.N, Samples: s.Values,
		Baseline: "esfctl activate + exec", BaselineValue: a.P50, Targets: []bench.Target{bench.RatioAtMost(1.3)}, Path: "e2b",
		Note: "Sandbox.create + commands.run('true') (bash -l -c true) through esfd's E2B front door, timed in node; baseline: activate --executor runc + exec of the same command through the API"})
	ms, err = bench.Interleave(ctx, e.Size(3, 10), func(ctx context.Context) (bench.Measurement, error) { return ask("fork") })
	if err != nil {
		return err
	}
	f := bench.Latencies(ms[0])
	e.Add(bench.Row{Name: "E2B SDK fork(count=4)", Value: f.P50, Unit: "ms", P90: f.P90, N: f.N, Samples: f.Values, Path: "e2b",
		Note: "Sandbox.fork({count: 4}) of a running sandbox: a keep-running seal, a fork of 4 drafts, 4 runc activations"})
	return nil
}

// npmCI installs e2e/e2bsdk's locked dependencies unless node_modules
// already holds them (the stamp e2e's TestE2BSDK writes).
func npmCI(ctx context.Context, dir string) error {
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(lock)
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(dir, "node_modules", ".esf-lock-sha256")
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return nil
	}
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return errors.Join(fmt.Errorf("npm ci: %v", err), errors.New(string(out)))
	}
	return os.WriteFile(stamp, []byte(want), 0o644)
}
