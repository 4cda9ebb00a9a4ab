package delta

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"

	"github.com/esf-dev/esf/ingest"
	"github.com/esf-dev/esf/internal/testenv"
)

// notApplicable lists posixtest cases that test a property overlayfs
// itself does not have, with the reason; every other case must pass on an
// attempt root (overlayfs on the FUSE projection).
var notApplicable = map[string]string{
	"FcntlFlockLocksFile": "POSIX record locks belong to the process, so two fds of one process never " +
		"conflict: ext4 fails this case too; it expects a FUSE server's per-fd lock owners",
}

func posixCases() []string {
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// TestPosixOnAttemptRoot runs go-fuse's POSIX conformance cases against an
// attempt's writable root: overlayfs with the projection as its lower
// layer. Every file the cases touch is new (in the upper directory);
// TestPosixOnLowerFiles covers files from the lower layer.
func TestPosixOnAttemptRoot(t *testing.T) {
	_, _, lower := projected(t, nil)
	for _, name := range posixCases() {
		t.Run(name, func(t *testing.T) {
			if why, ok := notApplicable[name]; ok {
				t.Skip(why)
			}
			l := attempt(t, lower)
			posixtest.All[name](t, l.Root)
		})
	}
}

// posixPlanEnv makes TestPosixPlan run the posixtest cases of a plan (a
// JSON map from case name to directory) and write which passed to the file
// named by posixResultEnv. The differential test runs it as a separate
// process, so that a case may fail there without failing the test.
const (
	posixPlanEnv   = "ESF_DELTA_POSIX_PLAN"
	posixResultEnv = "ESF_DELTA_POSIX_RESULT"
)

// TestPosixPlan is a helper, not a test: it does nothing unless started by
// runPosixPlan.
func TestPosixPlan(t *testing.T) {
	plan := os.Getenv(posixPlanEnv)
	if plan == "" {
		t.Skip("helper: runs posixtest cases for TestPosixOnLowerFiles")
	}
	var dirs map[string]string
	if err := json.Unmarshal([]byte(plan), &dirs); err != nil {
		t.Fatal(err)
	}
	passed := map[string]bool{}
	for _, name := range posixCases() {
		if dir, ok := dirs[name]; ok {
			passed[name] = t.Run(name, func(t *testing.T) { posixtest.All[name](t, dir) })
		}
	}
	b, _ := json.Marshal(passed)
	if err := os.WriteFile(os.Getenv(posixResultEnv), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// posixRun is the outcome of a plan: which cases passed, the output of
// each, and the directory each ran in.
type posixRun struct {
	passed map[string]bool
	output map[string]string
	dirs   map[string]string
}

// failureLine is a t.Error line in -test.v output: its source location
// and message.
var failureLine = regexp.MustCompile(`^\s+(\w+\.go:\d+): (.*)$`)

// firstFailure is where case name first failed in run and what it said,
// with the directory it ran in written as DIR: two runs that fail the
// same check the same way give the same string.
func firstFailure(run posixRun, name string) string {
	for _, line := range strings.Split(run.output[name], "\n") {
		if m := failureLine.FindStringSubmatch(line); m != nil {
			return m[1] + ": " + strings.ReplaceAll(m[2], run.dirs[name], "DIR")
		}
	}
	return "no failure reported"
}

// runPosixPlan runs the cases of dirs (case name to directory) in a child
// process.
func runPosixPlan(t *testing.T, dirs map[string]string) posixRun {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	plan, _ := json.Marshal(dirs)
	result := filepath.Join(t.TempDir(), "result.json")
	cmd := exec.Command(exe, "-test.run=^TestPosixPlan$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), posixPlanEnv+"="+string(plan), posixResultEnv+"="+result)
	cmd.Dir = "/"
	out, _ := cmd.CombinedOutput() // failing cases fail the child
	b, err := os.ReadFile(result)
	if err != nil {
		t.Fatalf("posixtest child wrote no result (%v):\n%s", err, out)
	}
	run := posixRun{output: map[string]string{}, dirs: dirs}
	if err := json.Unmarshal(b, &run.passed); err != nil {
		t.Fatal(err)
	}
	// Split -test.v output by case.
	cur := ""
	for _, line := range strings.SplitAfter(string(out), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "=== RUN   TestPosixPlan/"); ok {
			cur = name
		}
		run.output[cur] += line
	}
	return run
}

// TestPosixOnLowerFiles runs go-fuse's POSIX conformance cases a second
// time over what their first run left, so that the files they open,
// truncate, append to, link, rename and unlink come from the lower layer:
// each case runs on an attempt over the sealed node of its first run's
// directory, and on plain overlayfs over that directory itself. Both must
// agree on every case; a case that fails a second run on plain overlayfs
// too (it creates what already exists, or appends to its own earlier
// output) must fail on the attempt as well, at the same check with the
// same message. The same cases then run on the
// read-only projection of that node and on a read-only bind of the
// directory, where they must agree too: every case that writes fails on
// both, alike (a read-only mount), and those that only read must pass on
// both.
func TestPosixOnLowerFiles(t *testing.T) {
	testenv.Require(t, "root", "fuse", "overlay")
	ctx := context.Background()
	st, mnt := projection(t)

	// First runs, on plain directories; what they leave becomes a node.
	plain, ours, roPlain, roOurs := map[string]string{}, map[string]string{}, map[string]string{}, map[string]string{}
	withFiles := 0
	for _, name := range posixCases() {
		if _, ok := notApplicable[name]; ok {
			continue // fails its first run on ext4 already
		}
		dir := filepath.Join(t.TempDir(), "lower")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if !t.Run("first/"+name, func(t *testing.T) { posixtest.All[name](t, dir) }) {
			continue
		}
		if ents, _ := os.ReadDir(dir); len(ents) > 0 {
			withFiles++
		}
		res, err := ingest.Dir(ctx, st, dir, ingest.Options{})
		if err != nil {
			t.Fatalf("import what %s left: %v", name, err)
		}
		proj := filepath.Join(mnt, "roots", res.Root.String())
		plain[name], ours[name] = attempt(t, dir).Root, attempt(t, proj).Root
		roPlain[name], roOurs[name] = roBind(t, dir), proj
	}
	t.Logf("%d of %d cases left files for their second run to find in the lower layer", withFiles, len(plain))

	compare := func(what, wantName, gotName string, want, got posixRun) {
		var both []string
		for _, name := range posixCases() {
			w, ok := want.passed[name]
			if !ok {
				continue
			}
			g := got.passed[name]
			switch {
			case g != w:
				t.Errorf("%s %s: passes on %s %v, on %s %v\n%s:\n%s\n%s:\n%s", what, name, wantName, w, gotName, g,
					wantName, want.output[name], gotName, got.output[name])
			case g:
				both = append(both, name)
			default:
				// Failing on both is agreement only if both fail alike.
				if wf, gf := firstFailure(want, name), firstFailure(got, name); wf != gf {
					t.Errorf("%s %s: fails differently on %s (%s) and on %s (%s)", what, name, wantName, wf, gotName, gf)
				}
			}
		}
		t.Logf("%s: %d of %d cases pass on both (%s), the others fail on both at the same check", what, len(both), len(want.passed),
			strings.Join(both, " "))
	}
	compare("second run over lower files", "plain overlayfs", "the attempt", runPosixPlan(t, plain), runPosixPlan(t, ours))
	compare("read-only", "a read-only bind", "the projection", runPosixPlan(t, roPlain), runPosixPlan(t, roOurs))
}

// roBind shows dir read-only at a new path.
func roBind(t *testing.T, dir string) string {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.ReadOnlyBind(t, dir, mnt)
	return mnt
}
