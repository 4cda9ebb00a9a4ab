package crashtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/journal"
	jetcd "github.com/esf-dev/esf/journal/etcd"
	"github.com/esf-dev/esf/journal/failpoint"
)

// graph is the prepared state every case starts from, and the ids in it:
//
//	R   sealed: the group's root node, canonical at generation 1
//	├── A   sealed (a seal of a draft)
//	│   └── A1   sealed (a seal of a draft)
//	├── B   sealed
//	│   ├── B1   draft
//	│   └── B2   draft
//	├── C   draft
//	└── D   draft
type graph struct {
	mode                      *journalMode
	prefix                    string // the journal's key prefix (etcd)
	state                     string // template state dir, projection unmounted
	RootID                    string // the imported fixture's root
	Group                     string
	R, A, A1, B, B1, B2, C, D string
	Evidence                  string // an object for evaluate
	fixture                   string // the imported directory
	err                       error
	buildTime                 time.Duration

	snapOnce sync.Once
	snap     *snapshot
	snapErr  error
}

// templates holds one template graph per journal mode.
var (
	tplMu     sync.Mutex
	templates = map[string]*graph{}
	tplOnces  = map[string]*sync.Once{}
)

// snapshot is the template's journal, read and audited once.
func (g *graph) snapshot(t *testing.T) *snapshot {
	t.Helper()
	g.snapOnce.Do(func() {
		g.snap, g.snapErr = g.mode.read(g.state, g.prefix, filepath.Join(workDir, "tpl-"+g.mode.name, "journal-copy"))
		if g.snapErr == nil {
			if bad := g.snap.audit(); len(bad) > 0 {
				g.snapErr = fmt.Errorf("template journal inconsistent:\n  %s", strings.Join(bad, "\n  "))
			}
		}
	})
	if g.snapErr != nil {
		t.Fatal(g.snapErr)
	}
	return g.snap
}

// template builds the graph of a journal mode once per run with a clean
// esfd.
func template(t *testing.T, mode *journalMode) *graph {
	t.Helper()
	requireRoot(t)
	tplMu.Lock()
	once, ok := tplOnces[mode.name]
	if !ok {
		once = &sync.Once{}
		tplOnces[mode.name] = once
	}
	tplMu.Unlock()
	once.Do(func() {
		start := time.Now()
		g := &graph{mode: mode, prefix: "crash/tpl"}
		g.err = g.build()
		g.buildTime = time.Since(start)
		tplMu.Lock()
		templates[mode.name] = g
		tplMu.Unlock()
	})
	tplMu.Lock()
	g := templates[mode.name]
	tplMu.Unlock()
	if g.err != nil {
		t.Fatalf("prepare the %s template state: %v", mode.name, g.err)
	}
	return g
}

// buildTime is how long the template of mode took, for the report.
func buildTime(mode *journalMode) time.Duration {
	tplMu.Lock()
	defer tplMu.Unlock()
	if g := templates[mode.name]; g != nil {
		return g.buildTime
	}
	return 0
}

func (g *graph) build() (err error) {
	dir := filepath.Join(workDir, "tpl-"+g.mode.name)
	g.state = filepath.Join(dir, "state")
	g.fixture = filepath.Join(dir, "fixture")
	if err := writeFixture(g.fixture); err != nil {
		return err
	}
	d, err := startDaemon(g.state, filepath.Join(dir, "s.sock"), "", g.mode.args(g.prefix))
	if err != nil {
		return err
	}
	defer func() {
		if serr := d.stop(); err == nil {
			err = serr
		}
		if notes := teardown(dir, g.state, g.mode, g.prefix, true); len(notes) > 0 && err == nil {
			err = fmt.Errorf("template teardown: %s", strings.Join(notes, "; "))
		}
		if err != nil {
			err = fmt.Errorf("%w\nesfd log:\n%s", err, tail(d.logs.String()))
		}
	}()
	n := 0
	call := func(path string, body, out any) error {
		n++
		r, err := d.call(http.MethodPost, path, fmt.Sprintf("tpl-%d", n), body)
		if err != nil {
			return fmt.Errorf("POST %s: %w", path, err)
		}
		if r.status != http.StatusOK {
			return fmt.Errorf("POST %s: %s", path, r)
		}
		return json.Unmarshal(r.body, out)
	}
	var imp struct {
		RootID string `json:"root_id"`
	}
	if err := call("/v1/import", map[string]string{"source": g.fixture}, &imp); err != nil {
		return err
	}
	g.RootID = imp.RootID
	var cg fabric.CreateGroupResult
	if err := call("/v1/groups", map[string]string{"root_id": g.RootID}, &cg); err != nil {
		return err
	}
	g.Group, g.R = cg.Group.GroupID, cg.Node.NodeID
	fork := func(parent string, n int) ([]string, error) {
		var res fabric.ForkResult
		if err := call("/v1/fork", fabric.ForkRequest{NodeID: parent, N: n}, &res); err != nil {
			return nil, err
		}
		var ids []string
		for _, n := range res.Nodes {
			ids = append(ids, n.NodeID)
		}
		return ids, nil
	}
	// seal activates a node, writes one file and suspends.
	seal := func(node string) (string, error) {
		var a fabric.AttemptView
		if err := call("/v1/activate", fabric.ActivateRequest{NodeID: node}, &a); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(a.Root, "sealed-"+node+".txt"), []byte(node), 0o644); err != nil {
			return "", err
		}
		var res fabric.SuspendResult
		if err := call("/v1/suspend", fabric.SuspendRequest{AttemptID: a.AttemptID}, &res); err != nil {
			return "", err
		}
		return res.Node.NodeID, nil
	}
	kids, err := fork(g.R, 4)
	if err != nil {
		return err
	}
	g.A, g.B, g.C, g.D = kids[0], kids[1], kids[2], kids[3]
	for _, node := range []string{g.A, g.B} {
		if sealed, err := seal(node); err != nil || sealed != node {
			return fmt.Errorf("seal draft %s: got node %s, %v", node, sealed, err)
		}
	}
	if kids, err = fork(g.B, 2); err != nil {
		return err
	}
	g.B1, g.B2 = kids[0], kids[1]
	if kids, err = fork(g.A, 1); err != nil {
		return err
	}
	if g.A1, err = seal(kids[0]); err != nil {
		return err
	}
	var ev struct {
		ID string `json:"id"`
	}
	r, err := d.call(http.MethodPost, "/v1/evidence", "tpl-evidence", "crash test evidence")
	if err != nil || r.status != http.StatusOK {
		return fmt.Errorf("POST /v1/evidence: %v %v", r, err)
	}
	if err := json.Unmarshal(r.body, &ev); err != nil {
		return err
	}
	g.Evidence = ev.ID
	return nil
}

// outcome is what a crash left of an operation.
type outcome string

const (
	absent   outcome = "absent"
	complete outcome = "complete"
)

// opSpec is one mutating operation under test.
type opSpec struct {
	name string // subtest name; several specs may share an op
	op   string // the fabric op: its failpoints are "fabric.<op>.*"
	// prepare makes the operation's preconditions with a clean esfd on the
	// case's copy of the template (attempts); nil if the template has them.
	prepare func(c *caseRun)
	// request is the operation: a POST path and its body.
	request func(c *caseRun) (string, any)
	// classify decides from the journal alone whether the operation is
	// absent or complete, and returns an error for anything partial. It
	// sees the state before the operation and after (the crash, or the
	// replays: then it must say complete, and complete once).
	classify func(c *caseRun, before, after *snapshot) (outcome, error)
	// recovered checks the live invariants through the API after the
	// restart, before any replay; replayed checks them after the replays.
	recovered func(c *caseRun, o outcome)
	replayed  func(c *caseRun, r *reply)
	// write makes an attempt's changes (seal specs).
	write func(root, tag string) error
	// afterCrash, if set, runs after a crash, before the restart: it does
	// to the state what a machine crash could do and a SIGKILL does not.
	afterCrash func(c *caseRun, crash *snapshot)
	// storedReply: the reply of a replay is the stored result itself (the
	// graph operations); attempt operations answer with a fresh view.
	storedReply bool
	// staged: on etcd the operation's transaction is too large for one
	// request, so it also crashes where a published transaction has not
	// been rolled forward yet (journal.etcd.roll-forward).
	staged bool
}

// caseRun is one (operation, failpoint@k) case.
type caseRun struct {
	t      *testing.T
	g      *graph
	mode   *journalMode
	prefix string // the journal's key prefix (etcd)
	spec   *opSpec
	point  string // armed failpoint, "" for the control run
	k      int
	dir    string
	state  string
	socket string
	key    string
	d      *daemon
	before *snapshot         // the journal before the operation
	pre    map[string]string // ids and paths made by prepare
	saw    map[string]string // manifest of the attempt's root before the operation
	notes  []string          // what recovery did, for the matrix
	seq    int

	noEndpoint bool // esfd answered the operation with "no endpoint"
}

var caseSeq atomic.Int64

// phases accumulates where the cases spend their time, for the report.
type phases struct {
	mu sync.Mutex
	d  map[string]time.Duration
	n  map[string]int
}

var timing = &phases{d: map[string]time.Duration{}, n: map[string]int{}}

func (p *phases) since(name string, start time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.d[name] += time.Since(start)
	p.n[name]++
}

func (p *phases) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var parts []string
	for name, d := range p.d {
		parts = append(parts, fmt.Sprintf("%s %v/%d", name, d.Round(time.Millisecond), p.n[name]))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// matrix collects the outcome of every case for the report.
type matrix struct {
	mu   sync.Mutex
	rows []string
}

func (m *matrix) add(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows = append(m.rows, fmt.Sprintf(format, args...))
}

func (m *matrix) log(t *testing.T, title string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	slices.Sort(m.rows)
	t.Logf("%s (operation | failpoint@k | left by the crash | after restart and replay):\n%s", title, strings.Join(m.rows, "\n"))
}

// points lists the failpoints an operation passes: its own, then the
// journal's (each op runs one or more journal Updates).
func points(op string) (own, journalPoints []string) {
	for _, name := range failpoint.Names() {
		switch {
		case strings.HasPrefix(name, "fabric."+op+"."):
			own = append(own, name)
		case strings.HasPrefix(name, "journal.update."):
			journalPoints = append(journalPoints, name)
		}
	}
	return own, journalPoints
}

// runSpec runs every case of spec: each of its own failpoints once, each
// journal failpoint at its 1st, 2nd, ... evaluation until the operation
// completes without reaching it.
func runSpec(t *testing.T, mode *journalMode, spec *opSpec, m *matrix) {
	own, jps := points(spec.op)
	if len(own) < 2 || len(jps) != 3 {
		t.Fatalf("%s: failpoints %v and %v: want fabric.%s.before-update/after-commit and 3 journal ones", spec.name, own, jps, spec.op)
	}
	for _, fp := range own {
		if _, _, missing := runCase(t, mode, spec, fp, 1, m); missing {
			t.Fatalf("%s: %s is not served by this esfd: every operation of the matrix must be", spec.name, spec.op)
		}
	}
	// Every Update evaluates begin; only those that write evaluate
	// before-commit and then after-commit. So begin's count bounds the
	// others', and after-commit's equals before-commit's: one run past the
	// last crash (a control run, where the operation completes) is enough.
	known := []string{journal.FailpointUpdateBegin, journal.FailpointUpdateBeforeCommit, journal.FailpointUpdateAfterCommit}
	if slices.Sort(known); !slices.Equal(jps, known) {
		t.Fatalf("journal failpoints %v: the sweep below knows begin, before-commit and after-commit", jps)
	}
	if spec.staged && mode.cluster != nil {
		if crashed, ran, _ := runCase(t, mode, spec, jetcd.FailpointRollForward, 1, m); ran && !crashed {
			t.Errorf("%s: %s not reached: the transaction was not staged", spec.name, jetcd.FailpointRollForward)
		}
	}
	updates := sweepPoint(t, mode, spec, m, journal.FailpointUpdateBegin, 8, true)
	writes := sweepPoint(t, mode, spec, m, journal.FailpointUpdateBeforeCommit, updates, false)
	if n := sweepPoint(t, mode, spec, m, journal.FailpointUpdateAfterCommit, writes, false); n != writes {
		t.Errorf("%s: %s reached %d times, before-commit %d", spec.name, journal.FailpointUpdateAfterCommit, n, writes)
	}
}

// sweepPoint runs fp at evaluations 1, 2, ... until one is not reached or
// max have crashed, and returns how many crashed. Past max, one more run
// is made only if control (and must not crash).
func sweepPoint(t *testing.T, mode *journalMode, spec *opSpec, m *matrix, fp string, max int, control bool) int {
	for k := 1; ; k++ {
		if k > max && !control {
			return max
		}
		crashed, ran, _ := runCase(t, mode, spec, fp, k, m)
		switch {
		case !ran && k > max:
			return max // -run chose other cases: nothing to learn
		case !ran:
			continue
		case !crashed:
			return k - 1
		case k > max:
			t.Fatalf("%s: %s still reached at evaluation %d", spec.name, fp, k)
		}
	}
}

// runCase runs one case and reports whether the failpoint killed esfd,
// whether the case ran at all (-run may filter it out) and whether esfd
// had no endpoint for the operation (the case failed: a matrix entry that
// cannot run proves nothing and must not look green).
func runCase(t *testing.T, mode *journalMode, spec *opSpec, fp string, k int, m *matrix) (crashed, ran, missing bool) {
	name := fmt.Sprintf("%s@%d", fp, k)
	t.Run(name, func(t *testing.T) {
		ran = true
		c := newCase(t, mode, spec, fp, k)
		defer func() { missing = c.noEndpoint }()
		crashed = c.run(m)
	})
	return crashed, ran, missing
}

func newCase(t *testing.T, mode *journalMode, spec *opSpec, fp string, k int) *caseRun {
	g := template(t, mode)
	n := caseSeq.Add(1)
	c := &caseRun{t: t, g: g, mode: mode, prefix: fmt.Sprintf("crash/c%d", n), spec: spec, point: fp, k: k,
		pre: map[string]string{}, dir: filepath.Join(workDir, fmt.Sprintf("c%d", n))}
	c.state = filepath.Join(c.dir, "state")
	c.socket = filepath.Join(c.dir, "s.sock")
	c.key = fmt.Sprintf("crash-%s-%s-%d", spec.name, fp, k)
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer timing.since("teardown", time.Now())
		if c.d != nil {
			c.d.kill()
		}
		if notes := teardown(c.dir, c.state, c.mode, c.prefix, false); len(notes) > 0 {
			t.Logf("cleanup: %s", strings.Join(notes, "; "))
		}
		if ms := mountsUnder(c.dir); len(ms) > 0 {
			t.Errorf("mounts left under %s: %v", c.dir, ms)
		}
		if ps := esfProcesses(c.dir); len(ps) > 0 {
			t.Errorf("esfd processes left: %v", ps)
		}
		if !t.Failed() {
			os.RemoveAll(c.dir)
		}
	})
	start := time.Now()
	if out, err := exec.Command("cp", "-a", g.state, c.state).CombinedOutput(); err != nil {
		t.Fatalf("copy template: %v: %s", err, out)
	}
	if err := mode.copy(g.prefix, c.prefix); err != nil {
		t.Fatalf("copy the template's journal: %v", err)
	}
	timing.since("copy template", start)
	return c
}

// start runs esfd on the case's state, armed with spec if not empty.
func (c *caseRun) start(spec string) *daemon {
	c.t.Helper()
	defer timing.since("start", time.Now())
	d, err := startDaemon(c.state, c.socket, spec, c.mode.args(c.prefix))
	if err != nil {
		c.t.Fatal(err)
	}
	c.d = d
	c.t.Cleanup(func() {
		if c.t.Failed() {
			c.t.Logf("esfd (failpoints %q) log:\n%s", d.failpoints, tail(d.logs.String()))
		}
	})
	return d
}

// stop shuts the current daemon down gracefully.
func (c *caseRun) stop() {
	c.t.Helper()
	defer timing.since("stop", time.Now())
	if err := c.d.stop(); err != nil {
		c.t.Fatal(err)
	}
}

// snapshot reads and audits the journal as esfd left it: a copy after a
// crash (esfd must recover from the very bytes), in place otherwise.
func (c *caseRun) snapshot(when string, crashed bool) *snapshot {
	c.t.Helper()
	defer timing.since("journal read+audit", time.Now())
	scratch := ""
	if crashed {
		c.seq++
		scratch = filepath.Join(c.dir, fmt.Sprintf("journal-%d", c.seq))
	}
	s, err := c.mode.read(c.state, c.prefix, scratch)
	if err != nil {
		c.t.Fatalf("journal %s: %v", when, err)
	}
	if bad := s.audit(); len(bad) > 0 {
		c.t.Errorf("journal %s is inconsistent:\n  %s", when, strings.Join(bad, "\n  "))
	}
	return s
}

// do sends the operation under the case's key.
func (c *caseRun) do() (*reply, error) {
	path, body := c.spec.request(c)
	return c.d.call(http.MethodPost, path, c.key, body)
}

// mustDo is a preparation call with its own key; it must succeed.
func (c *caseRun) mustDo(path string, body, out any) {
	c.t.Helper()
	c.seq++
	c.d.must(c.t, http.MethodPost, path, fmt.Sprintf("prep-%d", c.seq), body, out)
}

func (c *caseRun) get(path string, out any) {
	c.t.Helper()
	c.d.must(c.t, http.MethodGet, path, "", nil, out)
}

func (c *caseRun) run(m *matrix) (crashed bool) {
	t := c.t
	if c.spec.prepare != nil {
		c.start("")
		start := time.Now()
		c.spec.prepare(c)
		timing.since("prepare", start)
		c.stop()
	}
	var before *snapshot
	if c.spec.prepare == nil {
		before = c.g.snapshot(t) // the template's, untouched so far
	} else {
		before = c.snapshot("before the operation", false)
	}
	c.before = before

	armed := c.start(fmt.Sprintf("%s=crash@%d", c.point, c.k))
	opStart := time.Now()
	first, err := c.do()
	if err != nil {
		crashed = true
		if ok, werr := armed.waitKilled(20 * time.Second); !ok {
			t.Fatalf("the reply was lost (%v) but: %v", err, werr)
		}
		timing.since("operation until the kill", opStart)
	} else {
		if first.status == http.StatusNotFound && bytes.Contains(first.body, []byte("no endpoint")) {
			c.noEndpoint = true
			t.Fatalf("esfd has no endpoint for %s: %s", c.spec.op, first)
		}
		if first.status != http.StatusOK {
			t.Fatalf("operation failed without a crash: %s", first)
		}
		// Its failpoint could still fire on a replay, or in the shutdown:
		// Close retires the seals' redo records in a journal Update
		// (fabric/storeredo.go), and a crash there is one more crash
		// after the operation completed, which the restart must survive.
		if err := c.d.stop(); err != nil {
			if killed, _ := armed.waitKilled(time.Second); !killed {
				t.Fatal(err)
			}
			t.Logf("the armed failpoint killed esfd in its shutdown, after the operation")
		}
	}
	crashState := c.snapshot("after the crash", crashed)
	left, err := c.spec.classify(c, before, crashState)
	if err != nil {
		t.Fatalf("partial operation after %s@%d: %v", c.point, c.k, err)
	}
	if !crashed && left != complete {
		t.Fatalf("the operation replied %s but the journal shows it %s", first, left)
	}
	if crashed && c.spec.afterCrash != nil {
		c.spec.afterCrash(c, crashState)
	}

	// Restart without failpoints: esfd recovers, then the key replays.
	c.start("")
	checks := time.Now()
	if c.spec.recovered != nil {
		c.spec.recovered(c, left)
	}
	r1, err := c.do()
	if err != nil {
		t.Fatalf("replay: no reply: %v", err)
	}
	r2, err := c.do()
	if err != nil {
		t.Fatalf("second replay: no reply: %v", err)
	}
	if r1.status != http.StatusOK {
		t.Errorf("replay of the key after a restart that found the operation %s: %s", left, r1)
	}
	if !bytes.Equal(r1.body, r2.body) || r1.status != r2.status {
		t.Errorf("two replays differ:\n%s\n%s", r1, r2)
	}
	if !crashed && !bytes.Equal(first.body, r1.body) {
		t.Errorf("the replay differs from the first reply:\n%s\n%s", first, r1)
	}
	if c.spec.replayed != nil && r1.status == http.StatusOK {
		c.spec.replayed(c, r1)
	}
	apiEvents := c.apiEvents()
	timing.since("checks and replays", checks)
	c.stop()
	final := c.snapshot("after the replays", false)
	if len(final.storeRedo) != 0 {
		t.Errorf("%d redo records of sealed objects outlived a clean stop", len(final.storeRedo))
	}
	if o, err := c.spec.classify(c, before, final); err != nil || o != complete {
		t.Errorf("after the replays the operation is %s, want complete (once): %v", o, err)
	}
	if e, ok := final.idem[c.key]; !ok {
		t.Errorf("no idempotency entry for %s after the replays", c.key)
	} else if c.spec.storedReply && r1.status == http.StatusOK && !jsonEqual(e.Result, r1.body) {
		t.Errorf("the replay is not the stored result:\nstored %s\nreply  %s", e.Result, r1.body)
	}
	// The API serves the same log the journal holds.
	if !reflect.DeepEqual(eventKeys(apiEvents), eventKeys(final.events)) {
		t.Errorf("GET /v1/events lists %d events, the journal %d", len(apiEvents), len(final.events))
	}

	what := string(left)
	switch {
	case crashed:
	case strings.HasPrefix(c.point, "journal."):
		what = "complete, no crash (control)"
	default:
		what = "not reached: complete, no crash"
	}
	after := "complete"
	if len(c.notes) > 0 {
		after += " (" + strings.Join(c.notes, "; ") + ")"
	}
	if !t.Failed() {
		m.add("%-22s | %-40s | %-28s | %s", c.spec.name, fmt.Sprintf("%s@%d", c.point, c.k), what, after)
	} else {
		m.add("%-22s | %-40s | %-28s | FAILED", c.spec.name, fmt.Sprintf("%s@%d", c.point, c.k), what)
	}
	return crashed
}

// apiEvents reads the whole log through GET /v1/events (JSON lines).
func (c *caseRun) apiEvents() []journal.Event {
	c.t.Helper()
	r := c.d.must(c.t, http.MethodGet, "/v1/events", "", nil, nil)
	var out []journal.Event
	dec := json.NewDecoder(bytes.NewReader(r.body))
	for dec.More() {
		var ev journal.Event
		if err := dec.Decode(&ev); err != nil {
			c.t.Fatalf("GET /v1/events: %v", err)
		}
		out = append(out, ev)
	}
	return out
}

func eventKeys(evs []journal.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, fmt.Sprintf("%d %s %s %s %s", ev.Seq, ev.Type, ev.NodeID, ev.AttemptID, ev.IdempotencyKey))
	}
	return out
}

// jsonEqual compares two JSON texts by meaning.
func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// note records, for the matrix, something recovery did.
func (c *caseRun) note(format string, args ...any) {
	c.notes = append(c.notes, fmt.Sprintf(format, args...))
}

// inspectNode and inspectAttempt read through the API.
func (c *caseRun) inspectNode(id string) fabric.NodeView {
	c.t.Helper()
	var in fabric.Inspection
	c.get("/v1/inspect/"+id, &in)
	if in.Node == nil {
		c.t.Fatalf("inspect %s: not a node: %+v", id, in)
	}
	return *in.Node
}

func (c *caseRun) inspectAttempt(id string) fabric.AttemptView {
	c.t.Helper()
	var in fabric.Inspection
	c.get("/v1/inspect/"+id, &in)
	if in.Attempt == nil {
		c.t.Fatalf("inspect %s: not an attempt: %+v", id, in)
	}
	return *in.Attempt
}

func (c *caseRun) inspectGroup(id string) fabric.GroupView {
	c.t.Helper()
	var in fabric.Inspection
	c.get("/v1/inspect/"+id, &in)
	if in.Group == nil {
		c.t.Fatalf("inspect %s: not a group: %+v", id, in)
	}
	return *in.Group
}

// unchanged reports the records of kind that differ between before and
// after, other than those in mayChange.
func unchanged[V any](kind string, before, after map[string]V, mayChange ...string) error {
	var diff []string
	for id, b := range before {
		if slices.Contains(mayChange, id) {
			continue
		}
		a, ok := after[id]
		if !ok {
			diff = append(diff, id+" vanished")
		} else if !reflect.DeepEqual(a, b) {
			diff = append(diff, fmt.Sprintf("%s changed: %+v -> %+v", id, b, a))
		}
	}
	if len(diff) > 0 {
		return fmt.Errorf("%s records changed that the operation does not touch: %s", kind, strings.Join(diff, "; "))
	}
	return nil
}

// idemState says whether the case's key is recorded for op in s, and
// fails on a key recorded for another op.
func (c *caseRun) idemState(s *snapshot) (bool, error) {
	e, ok := s.idem[c.key]
	if ok && e.Op != c.spec.op {
		return false, fmt.Errorf("key %s recorded for op %s", c.key, e.Op)
	}
	return ok, nil
}

// agree checks that the operation's records and its idempotency entry
// tell the same story, and returns the outcome.
func (c *caseRun) agree(applied bool, s *snapshot) (outcome, error) {
	recorded, err := c.idemState(s)
	if err != nil {
		return "", err
	}
	switch {
	case applied && recorded:
		return complete, nil
	case !applied && !recorded:
		return absent, nil
	case applied:
		return "", fmt.Errorf("the operation's records are there without its idempotency entry")
	}
	return "", fmt.Errorf("the idempotency entry is there without the operation's records")
}

// wantKeyEvents checks the types of the events written under the case's key.
func (c *caseRun) wantKeyEvents(s *snapshot, want ...string) error {
	got := s.eventsWithKey(c.key)
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("events under the key: %v, want %v", got, want)
	}
	return nil
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}
