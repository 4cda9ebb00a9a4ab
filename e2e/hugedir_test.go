package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hugeDirEntries is the size of TestBoundary_HugeDirMemory's directory:
// ESF_HUGEDIR_ENTRIES, or 100k (1M takes some minutes: bench/ and
// `ESF_HUGEDIR_ENTRIES=1000000 go test -run HugeDir ./e2e` run that).
func hugeDirEntries(t *testing.T) int {
	if v := os.Getenv("ESF_HUGEDIR_ENTRIES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("ESF_HUGEDIR_ENTRIES=%q", v)
		}
		return n
	}
	return 100_000
}

// hugeDirBudget is the peak RSS each of esfd and the projection server may
// reach for a directory of n entries: 256 MiB at a million (#15), and in
// proportion above a fixed 64 MiB (a daemon's own start) for fewer.
func hugeDirBudget(n int) int64 {
	const base, million = 64 << 20, 256 << 20
	return base + int64(float64(million-base)*float64(n)/1e6)
}

// TestBoundary_HugeDirMemory: one directory of many entries is imported,
// projected and listed (ls -f through a mount view), and exported, while
// neither esfd nor the projection server grows past a budget that is
// linear in the entries and 256 MiB at a million (VmHWM: the peak, not a
// sample). Memory is what is asserted; times are logged.
func TestBoundary_HugeDirMemory(t *testing.T) {
	n := hugeDirEntries(t)
	d := startDaemon(t)
	src := filepath.Join(hostDir(t), "huge")
	start := time.Now()
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	dfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		fd, err := unix.Openat(dfd, fmt.Sprintf("entry-%07d", i), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			unix.Close(dfd)
			t.Fatal(err)
		}
		unix.Close(fd)
	}
	unix.Close(dfd)
	t.Logf("%d empty files created in %v", n, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	root := strings.TrimSpace(longCtl(t, d, "import", src))
	tImport := time.Since(start)
	g := createGroup(t, d, root)
	view := filepath.Join(hostDir(t), "view")
	if err := os.Mkdir(view, 0o755); err != nil {
		t.Fatal(err)
	}
	d.mustCtl(nil, "mount", g.Node.NodeID, view)
	mounted := true
	defer func() {
		if mounted {
			d.ctl(nil, "umount", view)
		}
	}()
	start = time.Now()
	out, err := exec.Command("sh", "-c", "ls -f "+view+" | wc -l").Output()
	tList := time.Since(start)
	if err != nil {
		t.Fatalf("ls -f: %v", err)
	}
	// The projection lists no . and .. (the kernel answers for them).
	if got, _ := strconv.Atoi(strings.TrimSpace(string(out))); got != n && got != n+2 {
		t.Errorf("ls -f | wc -l = %d, want %d", got, n)
	}
	d.mustCtl(nil, "umount", view)
	mounted = false
	dest := filepath.Join(hostDir(t), "out")
	start = time.Now()
	longCtl(t, d, "export", root, "--to", dest)
	tExport := time.Since(start)
	if got, err := countEntries(dest); err != nil || got != n {
		t.Fatalf("export holds %d entries (%v), want %d", got, err, n)
	}

	budget := hugeDirBudget(n)
	esfd := peakRSS(t, d.cmd.Process.Pid)
	servers := projectionServers(d.state)
	if len(servers) != 1 {
		t.Fatalf("projection servers of the daemon: %v, want one", servers)
	}
	proj := peakRSS(t, servers[0])
	t.Logf("%d entries: import %v, ls -f %v, export %v; peak RSS esfd %d MiB, projection %d MiB (budget %d MiB each)",
		n, tImport.Round(time.Millisecond), tList.Round(time.Millisecond), tExport.Round(time.Millisecond),
		esfd>>20, proj>>20, budget>>20)
	if esfd > budget {
		t.Errorf("esfd peaked at %d MiB for %d entries, over %d MiB", esfd>>20, n, budget>>20)
	}
	if proj > budget {
		t.Errorf("the projection server peaked at %d MiB for %d entries, over %d MiB", proj>>20, n, budget>>20)
	}
}

// longCtl runs esfctl against d like mustCtl, with the time a million
// entries take on a loaded machine instead of ctl's five minutes.
func longCtl(t *testing.T, d *daemon, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, esfctlBin, args...)
	cmd.Env = append(os.Environ(), "ESF_SOCKET="+d.socket)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("esfctl %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// countEntries counts the names in dir without holding them.
func countEntries(dir string) (int, error) {
	f, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	for {
		names, err := f.Readdirnames(4096)
		n += len(names)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// peakRSS is a process's peak resident set size (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}
