package fabric

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/esf-dev/esf/cas"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/fusefs"
	"github.com/esf-dev/esf/mounter"
)

// projection is the one FUSE mount at <state>/mnt that shows every root.
// esfd runs it as a child process (the same binary, `esfd fuse-server`) so
// it survives a daemon restart and never shares a process with executors;
// with no command (tests) it is served in-process.
type projection struct {
	mnt     string
	command []string
	store   cas.Getter
	log     *slog.Logger
	logFile string
	pidFile string
	// corruptLog is where the server records corrupt blobs (see
	// Fabric.ReportCorrupt).
	corruptLog string
	// mounter serves the in-process projection and reads roots' attributes.
	mounter mounter.Mounter

	mu     sync.Mutex
	proc   *fusefs.Process
	inproc mounter.Server

	// attrs caches the attributes of projected roots that deltas copy to
	// their upper root: a root id names immutable content, so an entry
	// never goes stale. Bounded by dropping everything when full.
	attrMu sync.Mutex
	attrs  map[string]delta.RootAttr
}

// maxRootAttrs bounds the root attribute cache (a few hundred bytes each).
const maxRootAttrs = 4096

// RootPath is where root id shows in the projection.
func (p *projection) RootPath(rootID string) string {
	return filepath.Join(p.mnt, "roots", rootID)
}

// Ensure starts (or adopts) the projection server if it is not serving.
func (p *projection) Ensure(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inproc != nil || p.proc != nil && p.proc.Alive() {
		return nil
	}
	if len(p.command) == 0 {
		if err := os.MkdirAll(p.mnt, 0o700); err != nil {
			return err
		}
		srv, err := p.mounter.ServeProjection(p.mnt, fusefs.Options{Store: p.store, Logger: p.log,
			OnCorrupt: fusefs.AppendCorruptLog(p.corruptLog, p.log)})
		if err != nil {
			return err
		}
		p.inproc = srv
		return nil
	}
	proc, err := fusefs.EnsureServer(ctx, fusefs.StartOptions{
		Command: p.command, Mount: p.mnt, PidFile: p.pidFile, LogFile: p.logFile,
	})
	if err != nil {
		return fmt.Errorf("projection: %w", err)
	}
	p.proc = proc
	return nil
}

// started reports whether this process has started or adopted the
// projection. It does not check that the server still answers: the mount
// that needs it fails if it does not, and then calls Ensure (see mountDelta).
func (p *projection) started() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inproc != nil || p.proc != nil
}

// alive reports whether the projection answers; false if never started.
func (p *projection) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inproc != nil || p.proc != nil && p.proc.Alive()
}

// rootAttr returns the cached attributes of a projected root, reading and
// caching them on first use.
func (p *projection) rootAttr(rootID string) (*delta.RootAttr, error) {
	p.attrMu.Lock()
	a, ok := p.attrs[rootID]
	p.attrMu.Unlock()
	if ok {
		return &a, nil
	}
	a, err := p.mounter.RootAttr(p.RootPath(rootID))
	if err != nil {
		return nil, err
	}
	p.attrMu.Lock()
	if p.attrs == nil || len(p.attrs) >= maxRootAttrs {
		p.attrs = map[string]delta.RootAttr{}
	}
	p.attrs[rootID] = a
	p.attrMu.Unlock()
	return &a, nil
}

// Stop unmounts the projection; it fails while attempts still stack on it.
func (p *projection) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inproc != nil {
		if err := p.inproc.Unmount(); err != nil {
			return fmt.Errorf("unmount projection: %w", err)
		}
		p.inproc = nil
		return nil
	}
	if p.proc == nil {
		// Not started by us this time; a server from an earlier run may
		// still be there: its pid file lets Stop wait for it to exit.
		pid := 0
		if b, err := os.ReadFile(p.pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		p.proc = &fusefs.Process{Pid: pid, Mount: p.mnt}
	}
	if err := p.proc.Stop(); err != nil {
		return err
	}
	p.proc = nil
	return nil
}
