package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/esf-dev/esf/bench"
	"github.com/esf-dev/esf/ui"
)

// The web view (esfctl ui, issue 23) drawing a 10,000-node group in
// Debian's headless chromium: from the page asking for the tree to the
// first painted frame of it, as the page measures it (fetch through the
// view's server and esfd's GET /v1/tree, JSON parse, layout, canvas draw).
// It lives in a test file for chromedp, a test-only dependency.

func init() {
	bench.Register(bench.Scenario{Name: "ui", Order: 95, Run: benchUI})
}

const uiNodes = 10_000

func benchUI(ctx context.Context, e *bench.Env) error {
	const name = "web view: 10,000-node tree, request to painted"
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		e.Add(bench.Row{Name: name, Verdict: bench.VerdictSkip, Note: "needs chromium (scripts/deps.sh)"})
		return nil
	}
	d, err := e.StartDaemon(ctx, "ui")
	if err != nil {
		return err
	}
	src, err := e.Mkdir("ui-src")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("a\n"), 0o644); err != nil {
		return err
	}
	imp, err := d.Ops.Import(ctx, src)
	if err != nil {
		return err
	}
	g, err := d.Ops.CreateGroup(ctx, imp.RootID)
	if err != nil {
		return err
	}
	if _, err := d.Ops.Fork(ctx, g.Node.NodeID, uiNodes-1); err != nil {
		return err
	}

	srv, err := ui.New(d.Client, ui.Options{})
	if err != nil {
		return err
	}
	ln, err := ui.ListenLoopback("127.0.0.1:0")
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	e.Cleanup(func() error { stop(); return <-served })

	profile, err := e.Mkdir("ui-chromium")
	if err != nil {
		return err
	}
	actx, acancel := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(profile),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1400, 900))
	bctx, bcancel := chromedp.NewContext(actx)
	e.Cleanup(func() error { bcancel(); acancel(); return nil })
	u := srv.URL(ln.Addr())
	if err := chromedp.Do(bctx, chromedp.Navigate(u)); err != nil {
		return fmt.Errorf("chromium: %w", err)
	}

	type render struct {
		Nodes    int     `json:"nodes"`
		FetchMS  float64 `json:"fetch_ms"`
		LayoutMS float64 `json:"layout_ms"`
		DrawMS   float64 `json:"draw_ms"`
		TotalMS  float64 `json:"total_ms"`
	}
	base := "http://" + ln.Addr().String() + "/"
	var total, fetch, layoutDraw []float64
	for i := range e.Size(3, 7) {
		// A fresh page each time: nothing cached in the page's state.
		if err := chromedp.Do(bctx, chromedp.Navigate("about:blank"), chromedp.Navigate(base+"#/g/"+g.Group.GroupID)); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(bctx, 5*time.Minute)
		var raw string
		for {
			raw, err = chromedp.Run(wctx, chromedp.Poll[string](fmt.Sprintf(
				`window.esfUI && esfUI.lastRender()?.nodes === %d && JSON.stringify(esfUI.lastRender())`, uiNodes),
				chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(5*time.Minute)))
			// A poll that started while the page was still replacing
			// about:blank loses its execution context; poll the new one.
			if err == nil || !strings.Contains(err.Error(), "Cannot find context with specified id") || wctx.Err() != nil {
				break
			}
		}
		cancel()
		if err != nil {
			return fmt.Errorf("render %d: %w", i, err)
		}
		var r render
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			return err
		}
		total = append(total, r.TotalMS)
		fetch = append(fetch, r.FetchMS)
		layoutDraw = append(layoutDraw, r.LayoutMS+r.DrawMS)
	}
	s, f, ld := bench.Summarize(total), bench.Summarize(fetch), bench.Summarize(layoutDraw)
	e.Add(bench.Row{Name: name, Value: s.P50, Unit: "ms", P90: s.P90, N: s.N, Samples: total,
		Targets: []bench.Target{bench.AtMost(2000)}, Path: "api",
		Note: fmt.Sprintf("headless chromium, canvas; of which the tree's fetch (esfd GET /v1/tree through the view's server, JSON parse) p50 %.0f ms, layout + draw p50 %.0f ms", f.P50, ld.P50)})
	return nil
}
