package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// teardown runs `esfd stop-all` on the daemon's state (the daemon is
// stopped: cleanups run in reverse, so every later daemon on the same state
// has stopped too) and fails the test if an esf mount under the daemon's
// directory or a projection server of its state is left.
func (d *daemon) teardown() {
	t := d.t
	if _, err := os.Stat(d.state); err != nil {
		return // never created
	}
	out, err := exec.Command(esfdBin, append([]string{"stop-all", "--state", d.state, "--log-level", "warn"}, d.stopAllFlags...)...).CombinedOutput()
	if err != nil {
		t.Errorf("esfd stop-all: %v\n%s", err, out)
	}
	if t.Failed() {
		if b, err := os.ReadFile(filepath.Join(d.state, "fuse-server.log")); err == nil {
			t.Logf("fuse-server log:\n%s", b)
		}
	}
	if m := esfMounts(filepath.Dir(d.state)); len(m) > 0 {
		t.Errorf("esf mounts left after stop-all: %v", m)
		for _, p := range m {
			exec.Command("umount", "-l", p).Run() // do not leak into the next test
		}
	}
	if pids := projectionServers(d.state); len(pids) > 0 {
		t.Errorf("projection servers of %s left after stop-all: %v", d.state, pids)
	}
}

// esfMounts lists, with findmnt, the FUSE projections, their binds and the
// attempt overlays mounted under dir, and the disk pool (btrfs) of their deltas.
func esfMounts(dir string) []string {
	out, err := exec.Command("findmnt", "-rn", "-o", "TARGET", "-t", "fuse.esf,overlay,btrfs").Output()
	if err != nil && len(out) == 0 {
		return nil // findmnt exits 1 when nothing matches
	}
	var under []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		p := unescapeFindmnt(line)
		if p == dir || strings.HasPrefix(p, dir+"/") {
			under = append(under, p)
		}
	}
	return under
}

// unescapeFindmnt undoes findmnt -r's \xNN escapes.
func unescapeFindmnt(s string) string {
	if !strings.Contains(s, `\x`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		var c byte
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' {
			if _, err := fmt.Sscanf(s[i+2:i+4], "%02x", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// projectionServers lists the live (not zombie) `esfd fuse-server`
// processes of state.
func projectionServers(state string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
		server, ofState := false, false
		for i, a := range args {
			server = server || string(a) == "fuse-server"
			ofState = ofState || string(a) == "--state" && i+1 < len(args) && string(args[i+1]) == state
		}
		if server && ofState && !isZombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}
