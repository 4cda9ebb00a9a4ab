package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/esf-dev/esf/internal/testenv"
)

// The web view (esfctl ui, issue 23) driven in Debian's chromium, headless,
// against a real esfd and the real esfctl: what the tree draws, a click on
// a node, a fork made with esfctl showing up live, the diff and file views,
// a promote through the confirmation dialog, and the token check.

// uiServer runs `esfctl ui` against d and returns its URL (with the token).
func uiServer(t *testing.T, d *daemon) string {
	t.Helper()
	cmd := exec.Command(esfctlBin, "ui", "--addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "ESF_SOCKET="+d.socket)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if _, u, ok := strings.Cut(sc.Text(), "esf view: "); ok {
				urls <- u
			}
		}
		io.Copy(io.Discard, out)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("esfctl ui: %v\n%s", err, stderr.String())
			}
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-exited
			t.Errorf("esfctl ui did not stop on SIGINT\n%s", stderr.String())
		}
	})
	select {
	case u := <-urls:
		return u
	case err := <-exited:
		t.Fatalf("esfctl ui exited: %v\n%s", err, stderr.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("esfctl ui printed no URL\n%s", stderr.String())
	}
	return ""
}

// browser starts headless chromium with a fresh profile and no network
// beyond loopback; the context lives until the test ends. Uncaught page
// exceptions fail the test.
func browser(t *testing.T) context.Context {
	t.Helper()
	testenv.Require(t, "cmd:chromium")
	path, _ := exec.LookPath("chromium")
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox, // root in CI
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-breakpad", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 900),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	var mu sync.Mutex
	var exceptions []string
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			mu.Lock()
			x := e.ExceptionDetails
			msg := x.Text
			if x.Exception != nil {
				msg += " " + x.Exception.Description
			}
			exceptions = append(exceptions, fmt.Sprintf("%s:%d:%d: %s", x.URL, x.LineNumber+1, x.ColumnNumber+1, msg))
			mu.Unlock()
		}
	}); err != nil {
		acancel()
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		acancel() // kills the browser and waits for it
		mu.Lock()
		defer mu.Unlock()
		for _, e := range exceptions {
			t.Errorf("page exception: %s", e)
		}
	})
	return ctx
}

// artifacts is where screenshots go: $ESF_TEST_ARTIFACTS/ui, or a
// directory kept under the system's temp directory (logged).
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("ESF_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "esf-test-artifacts")
	}
	dir = filepath.Join(dir, "ui")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

func do[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	v, err := chromedp.Run(actx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// waitPage polls a JavaScript predicate until it is truthy (generous
// deadline: the machine may be loaded).
func waitPage(t *testing.T, ctx context.Context, what, predicate string) {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err := chromedp.Run(pctx, chromedp.Poll[chromedp.Void](predicate, chromedp.WithPollingInterval(50*time.Millisecond),
		chromedp.WithPollingTimeout(2*time.Minute)))
	if err != nil {
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 4000)`))
		t.Fatalf("wait for %s: %v\npage text:\n%s", what, err, text)
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	return do(t, ctx, expr, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
}

func shot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	b := do(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func clickSel(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	waitPage(t, ctx, sel, fmt.Sprintf(`(e => e && !e.disabled)(document.querySelector(%q))`, sel))
	eval[bool](t, ctx, fmt.Sprintf(`(document.querySelector(%q).click(), true)`, sel))
}

type drawnNode struct {
	ID        string  `json:"id"`
	Status    string  `json:"status"`
	Fill      string  `json:"fill"`
	Canonical bool    `json:"canonical"`
	Dimmed    bool    `json:"dimmed"`
	X         float64 `json:"x"`
	Y         float64 `json:"y"`
	Visible   bool    `json:"visible"`
}

type treeJSON struct {
	Group struct {
		GroupID         string `json:"group_id"`
		CanonicalNodeID string `json:"canonical_node_id"`
		Generation      uint64 `json:"generation"`
	} `json:"group"`
	Nodes []struct {
		NodeID string `json:"node_id"`
		Status string `json:"status"`
	} `json:"nodes"`
}

func TestUI_Browser(t *testing.T) {
	if sharedRemote.srv != nil {
		// The view reads content only through esfd's diff, patch and file
		// endpoints, which this pass's API tests already cover on the remote
		// store; a second browser run there proves nothing more.
		t.Skip("ESF_E2E_CAS_REMOTE pass: the browser test adds nothing about the content store")
	}
	requireFUSE(t) // the seeded group has a sealed child with its own files
	d := startDaemon(t)
	ctx := browser(t) // stopped before the daemon: cleanups run last first
	shots := artifacts(t)

	// Seed: root (canonical) -> a sealed child with a changed and a new
	// file, evaluated; a draft; a pruned draft; a terminal grandchild.
	g := createGroup(t, d, smallTree(t, d, map[string]string{"notes.md": "one\ntwo\n", "src/main.go": "package main\n"}))
	root := g.Node.NodeID
	kids := fork(t, d, root, 3)
	a := activate(t, d, kids[0])
	writeFile(t, filepath.Join(a.Root, "notes.md"), "one\ntwo\nthree\n")
	writeFile(t, filepath.Join(a.Root, "result.txt"), "computed\n")
	suspend(t, d, a.AttemptID, "--logical-state", `{"step":1}`)
	d.mustCtl(nil, "evaluate", kids[0], "--evaluator", "pytest@8", "--reward", "0.75", "--verdict", "pass", "--backprop")
	d.mustCtl(nil, "prune", kids[2])
	grand := fork(t, d, kids[0], 1)
	b := activate(t, d, grand[0])
	suspend(t, d, b.AttemptID)
	d.mustCtl(nil, "evaluate", grand[0], "--evaluator", "pytest@8", "--reward", "1", "--verdict", "pass", "--terminal", "--backprop")

	// A live attempt on the draft, for the groups view's count.
	la := activate(t, d, kids[1])
	t.Cleanup(func() { d.ctl(nil, "release", la.AttemptID) })

	u := uiServer(t, d)
	base := strings.SplitN(u, "/?", 2)[0]

	// Without the token, or with a wrong one, nothing is served; nor to a
	// Host that is not loopback (DNS rebinding).
	for _, c := range []struct {
		path, host string
		want       int
	}{
		{"/", "", http.StatusUnauthorized},
		{"/api/groups", "", http.StatusUnauthorized},
		{"/static/app.js", "", http.StatusUnauthorized},
		{"/?token=" + strings.Repeat("0", 64), "", http.StatusUnauthorized},
		{"/api/groups?token=" + strings.SplitN(u, "token=", 2)[1], "evil.example:80", http.StatusForbidden},
	} {
		req, _ := http.NewRequest(http.MethodGet, base+c.path, nil)
		if c.host != "" {
			req.Host = c.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s (Host %q) without a valid token: %d, want %d", c.path, c.host, resp.StatusCode, c.want)
		}
	}
	// A mutation needs the X-Esf-UI header even with the token.
	resp, err := http.Post(u+"&x=1", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST without %s: %d, want 403", "X-Esf-UI", resp.StatusCode)
	}

	// Groups.
	do(t, ctx, "open "+base, chromedp.Navigate(u))
	waitPage(t, ctx, "the groups table", fmt.Sprintf(`document.querySelector('#groups tr[data-group=%q] .nodes')?.textContent === '5'`, g.Group.GroupID))
	if n := eval[string](t, ctx, fmt.Sprintf(`document.querySelector('#groups tr[data-group=%q] .live-attempts').textContent`, g.Group.GroupID)); n != "1" {
		t.Errorf("groups view: %s live attempts, want 1", n)
	}
	if loc := eval[string](t, ctx, `location.href`); strings.Contains(loc, "token") {
		t.Errorf("the token stays in the address bar: %s", loc)
	}
	shot(t, ctx, shots, "groups.png")

	// The tree: every node, with its status colour and the canonical mark.
	do(t, ctx, "open the tree", chromedp.Navigate(base+"/#/g/"+g.Group.GroupID))
	waitPage(t, ctx, "the tree", `esfUI.lastRender()?.nodes === 5 && esfUI.drawn().length === 5`)
	var tv treeJSON
	decode(t, d.mustCtl(nil, "-o", "json", "tree", g.Group.GroupID), &tv)
	checkDrawn(t, eval[[]drawnNode](t, ctx, `esfUI.drawn()`), tv)
	want := map[string]string{root: "sealed", kids[0]: "sealed", kids[1]: "draft", kids[2]: "pruned", grand[0]: "terminal"}
	for _, n := range eval[[]drawnNode](t, ctx, `esfUI.drawn()`) {
		if w, ok := want[n.ID]; ok && n.Status != w {
			t.Errorf("node %s drawn %s, want %s", n.ID, n.Status, w)
		}
	}
	shot(t, ctx, shots, "tree.png")

	// A click on the sealed child opens it: its provenance names the
	// attempt that sealed it.
	clickNode(t, ctx, kids[0])
	waitPage(t, ctx, "the node panel", fmt.Sprintf(`document.querySelector('#node-id')?.textContent === %q && !!document.querySelector('#provenance')`, kids[0]))
	prov := eval[string](t, ctx, `document.querySelector('#provenance').textContent`)
	if !strings.Contains(prov, "seal") || !strings.Contains(prov, a.AttemptID) {
		t.Errorf("provenance shows %q, want op seal and attempt %s", prov, a.AttemptID)
	}
	if st := eval[string](t, ctx, `document.querySelector('#node-status').textContent`); st != "sealed" {
		t.Errorf("node panel status %q", st)
	}
	if ev := eval[string](t, ctx, `document.querySelector('#evaluations')?.textContent || ''`); !strings.Contains(ev, "pytest@8") || !strings.Contains(ev, "0.750") {
		t.Errorf("evaluations show %q", ev)
	}
	shot(t, ctx, shots, "node.png")

	// Keyboard: down to the child, up to the parent, to a sibling and back.
	sib := eval[[]string](t, ctx, fmt.Sprintf(`esfUI.siblings(%q)`, kids[0]))
	i := slices.Index(sib, kids[0])
	next, back := "ArrowRight", "ArrowLeft"
	if i == len(sib)-1 {
		next, back, i = "ArrowLeft", "ArrowRight", i-2
	}
	for _, k := range []struct {
		key  string
		want string
	}{{"ArrowDown", grand[0]}, {"ArrowUp", kids[0]}, {next, sib[i+1]}, {back, kids[0]}} {
		eval[bool](t, ctx, `(document.querySelector('#tree').focus(), true)`)
		do(t, ctx, "key "+k.key, chromedp.KeyEvent(map[string]string{"ArrowDown": kb.ArrowDown, "ArrowUp": kb.ArrowUp,
			"ArrowRight": kb.ArrowRight, "ArrowLeft": kb.ArrowLeft}[k.key]))
		waitPage(t, ctx, k.key+" to "+k.want, fmt.Sprintf(`esfUI.state().selected === %q && document.querySelector('#node-id')?.textContent === %q`, k.want, k.want))
	}

	// A fork through esfctl appears without a reload.
	waitPage(t, ctx, "the event stream", `esfUI.live()`)
	live := fork(t, d, kids[0], 2)
	waitPage(t, ctx, "the forked nodes", fmt.Sprintf(`(ids => ids.includes(%q) && ids.includes(%q))(esfUI.drawn().map(n => n.id))`, live[0], live[1]))
	shot(t, ctx, shots, "live.png")

	// Diff with the parent: the changed and the new file, then the text
	// diff of the changed one.
	clickSel(t, ctx, "#act-diff-parent")
	waitPage(t, ctx, "the changed paths", `!!document.querySelector('#changes tr[data-path="notes.md"]') && !!document.querySelector('#changes tr[data-path="result.txt"]')`)
	if k := eval[string](t, ctx, `document.querySelector('#changes tr[data-path="notes.md"] td').textContent`); k != "modified" {
		t.Errorf("notes.md kind %q, want modified", k)
	}
	clickSel(t, ctx, `#changes tr[data-path="notes.md"] a.path`)
	waitPage(t, ctx, "the file diff", `[...document.querySelectorAll('#file-diff .patch .add')].some(e => e.textContent === '+three')`)
	shot(t, ctx, shots, "diff.png")

	// Shift+click diffs the open node against the clicked one.
	clickSel(t, ctx, "#fit")
	waitPage(t, ctx, "the fitted view", `esfUI.drawn().every(n => n.visible)`)
	clickNodeUntil(t, ctx, kids[1], "the diff of two nodes", fmt.Sprintf(`esfUI.state().diffA === %q && esfUI.state().diffB === %q &&
		document.querySelector('#changes tr[data-path="result.txt"] td')?.textContent === 'deleted'`, kids[0], kids[1]),
		chromedp.ButtonModifiers(chromedp.ModifierShift))

	// Files: the sealed child's tree, and a download of one file.
	clickSel(t, ctx, "#tab-files")
	waitPage(t, ctx, "the file list", `!!document.querySelector('#files tr[data-name="result.txt"]') && !!document.querySelector('#files tr[data-name="src"]')`)
	href := eval[string](t, ctx, `document.querySelector('#files tr[data-name="result.txt"] a[download]').getAttribute('href')`)
	if got := eval[string](t, ctx, fmt.Sprintf(`fetch(%q).then(r => r.text())`, href)); got != "computed\n" {
		t.Errorf("download of result.txt: %q", got)
	}
	shot(t, ctx, shots, "files.png")

	// Promote from the view: the dialog shows the generation, and the
	// group's generation advances.
	clickSel(t, ctx, "#tab-node")
	clickSel(t, ctx, "#act-promote")
	waitPage(t, ctx, "the confirmation", `document.querySelector('#confirm').open`)
	if body := eval[string](t, ctx, `document.querySelector('#confirm-body').textContent`); !strings.Contains(body, "generation 1 → 2") {
		t.Errorf("promote dialog says %q", body)
	}
	shot(t, ctx, shots, "promote-confirm.png")
	clickSel(t, ctx, "#confirm-ok")
	waitPage(t, ctx, "the new generation", `esfUI.state().generation === 2`)
	decode(t, d.mustCtl(nil, "-o", "json", "tree", g.Group.GroupID), &tv)
	if tv.Group.Generation != 2 || tv.Group.CanonicalNodeID != kids[0] {
		t.Errorf("after promote from the view: generation %d canonical %s, want 2 %s", tv.Group.Generation, tv.Group.CanonicalNodeID, kids[0])
	}
	waitPage(t, ctx, "the canonical mark to move", fmt.Sprintf(`esfUI.drawn().some(n => n.id === %q && n.canonical)`, kids[0]))
	clickSel(t, ctx, "#fit") // the view was zoomed on the selection
	waitPage(t, ctx, "the fitted view", `esfUI.drawn().every(n => n.visible)`)
	checkDrawn(t, eval[[]drawnNode](t, ctx, `esfUI.drawn()`), tv)
	shot(t, ctx, shots, "promoted.png")

	// Fork and prune from the view, each through its confirmation.
	eval[bool](t, ctx, fmt.Sprintf(`(esfUI.select(%q), true)`, root))
	waitPage(t, ctx, "the root's panel", fmt.Sprintf(`document.querySelector('#node-id')?.textContent === %q`, root))
	eval[bool](t, ctx, `(document.querySelector('#fork-n').value = '2', true)`)
	clickSel(t, ctx, "#act-fork")
	waitPage(t, ctx, "the fork confirmation", `document.querySelector('#confirm').open && document.querySelector('#confirm-cmd').textContent.endsWith(' -n 2')`)
	clickSel(t, ctx, "#confirm-ok")
	waitPage(t, ctx, "the view's fork", `esfUI.drawn().length === 9`)
	eval[bool](t, ctx, fmt.Sprintf(`(esfUI.select(%q), true)`, live[0]))
	waitPage(t, ctx, "the draft's panel", fmt.Sprintf(`document.querySelector('#node-id')?.textContent === %q`, live[0]))
	clickSel(t, ctx, "#act-prune")
	waitPage(t, ctx, "the prune confirmation", `document.querySelector('#confirm').open`)
	clickSel(t, ctx, "#confirm-ok")
	waitPage(t, ctx, "the pruned draft", fmt.Sprintf(`esfUI.drawn().some(n => n.id === %q && n.status === 'pruned' && n.dimmed)`, live[0]))
	decode(t, d.mustCtl(nil, "-o", "json", "tree", g.Group.GroupID), &tv)
	clickSel(t, ctx, "#fit")
	waitPage(t, ctx, "the fitted view", `esfUI.drawn().every(n => n.visible)`)
	checkDrawn(t, eval[[]drawnNode](t, ctx, `esfUI.drawn()`), tv)

	// 10,000 nodes: measured and reported, not asserted.
	big := createGroup(t, d, smallTree(t, d, map[string]string{"a": "a\n"}))
	d.mustCtl(nil, "fork", big.Node.NodeID, "-n", "9999")
	start := time.Now()
	do(t, ctx, "open the big tree", chromedp.Navigate(base+"/#/g/"+big.Group.GroupID))
	waitPage(t, ctx, "10,000 nodes drawn", `esfUI.lastRender()?.nodes === 10000 && esfUI.drawn().length === 10000`)
	wall := time.Since(start)
	var stats map[string]float64
	raw := eval[string](t, ctx, `JSON.stringify(esfUI.lastRender())`)
	_ = json.Unmarshal([]byte(raw), &stats)
	t.Logf("10,000-node group: fetch %.0f ms, layout %.0f ms, draw %.0f ms, to the painted frame %.0f ms; navigation to drawn %v",
		stats["fetch_ms"], stats["layout_ms"], stats["draw_ms"], stats["total_ms"], wall.Round(time.Millisecond))
	shot(t, ctx, shots, "tree-10000.png")
	// Still responsive: a search finds a node and centres it.
	last := eval[string](t, ctx, `esfUI.drawn()[9999].id`)
	eval[bool](t, ctx, fmt.Sprintf(`(document.querySelector('#search-id').value = %q, document.querySelector('#search button').click(), true)`, last))
	waitPage(t, ctx, "the found node", fmt.Sprintf(`esfUI.state().selected === %q && esfUI.drawn().find(n => n.id === %q).visible`, last, last))
}

// checkDrawn compares what the canvas drew with the daemon's tree: every
// node once, its status and colour, the canonical mark on the canonical
// node only, pruned nodes dimmed, all inside the fitted view.
func checkDrawn(t *testing.T, drawn []drawnNode, tv treeJSON) {
	t.Helper()
	fills := map[string]string{"draft": "#b45309", "sealed": "#1d4ed8", "terminal": "#15803d", "pruned": "#9ca3af"}
	byID := map[string]drawnNode{}
	for _, n := range drawn {
		if _, dup := byID[n.ID]; dup {
			t.Errorf("node %s drawn twice", n.ID)
		}
		byID[n.ID] = n
	}
	if len(drawn) != len(tv.Nodes) {
		t.Errorf("drawn %d nodes, the tree has %d", len(drawn), len(tv.Nodes))
	}
	for _, n := range tv.Nodes {
		dn, ok := byID[n.NodeID]
		switch {
		case !ok:
			t.Errorf("node %s not drawn", n.NodeID)
		case dn.Status != n.Status || dn.Fill != fills[n.Status]:
			t.Errorf("node %s drawn %s in %s, want %s in %s", n.NodeID, dn.Status, dn.Fill, n.Status, fills[n.Status])
		case dn.Canonical != (n.NodeID == tv.Group.CanonicalNodeID):
			t.Errorf("node %s canonical mark %v", n.NodeID, dn.Canonical)
		case dn.Dimmed != (n.Status == "pruned"):
			t.Errorf("node %s dimmed %v", n.NodeID, dn.Dimmed)
		case !dn.Visible:
			t.Errorf("node %s outside the view", n.NodeID)
		}
	}
}

// clickNode clicks the canvas where it drew id, with real mouse events.
// clickNodeUntil clicks node id until predicate holds (at most 8 clicks,
// then waitPage's wait and failure): the click goes where the node is
// drawn when it is made, and a layout after a live update or the fit can
// move the node under it, so a click that hit nothing is made again at
// the node's new place. The clicks it is used for are idempotent.
func clickNodeUntil(t *testing.T, ctx context.Context, id, what, predicate string, opts ...chromedp.MouseOption) {
	t.Helper()
	for range 7 {
		clickNode(t, ctx, id, opts...)
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := chromedp.Run(pctx, chromedp.Poll[chromedp.Void](predicate, chromedp.WithPollingInterval(50*time.Millisecond),
			chromedp.WithPollingTimeout(20*time.Second)))
		cancel()
		if err == nil {
			return
		}
		t.Logf("click on %s: %s not yet (%v); clicking again", id, what, err)
	}
	clickNode(t, ctx, id, opts...)
	waitPage(t, ctx, what, predicate)
}

func clickNode(t *testing.T, ctx context.Context, id string, opts ...chromedp.MouseOption) {
	t.Helper()
	var pos struct{ X, Y float64 }
	raw := eval[string](t, ctx, fmt.Sprintf(`(() => { const r = document.querySelector('#tree').getBoundingClientRect();
		const n = esfUI.drawn().find(n => n.id === %q); return JSON.stringify({X: r.left + n.x, Y: r.top + n.y}); })()`, id))
	if err := json.Unmarshal([]byte(raw), &pos); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "click "+id, chromedp.MouseClickXY(pos.X, pos.Y, opts...))
}
