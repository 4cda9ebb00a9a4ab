package fusefs

import (
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
)

// liveNodes counts the nodes go-fuse holds under n (n included).
func liveNodes(n *fs.Inode) int {
	c := 1
	for _, ch := range n.Children() {
		c += liveNodes(ch)
	}
	return c
}

// Walks (READDIRPLUS makes nodes) racing the kernel's forgets leave no node
// behind once the kernel forgets everything: every lookup a listing made is
// paired with a forget, none is forgotten twice (the walks after would fail
// with EIO), and memory does not grow with the number of walks.
func TestHandlelessWalksLeakNoNodes(t *testing.T) {
	st := newCountingStore()
	root, want := buildDirs(t, st, 10, 1000, false)
	f, mnt := mount(t, st, root)
	base := liveNodes(&f.Inode)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	if got := walk(t, mnt); !slices.Equal(got, want) {
		t.Fatalf("first walk: %d paths, want %d", len(got), len(want))
	}
	peak := liveNodes(&f.Inode) // a node per path the kernel holds
	var first uint64
	const rounds = 6 // two walkers each: 12 walks (a minute and more under -race)
	for round := range rounds {
		var wg sync.WaitGroup
		errs := make(chan string, 4)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if got := walkQuiet(mnt); !slices.Equal(got, want) {
					errs <- "walk saw a different tree"
				}
			}()
		}
		wg.Add(1)
		go func() { // forgets while the walks list
			defer wg.Done()
			if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
				errs <- err.Error()
			}
		}()
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatalf("round %d: %s", round, e)
		}
		dropCaches(t)
		if round == 2 {
			first = heap()
		}
	}
	kernelHasNoOpendir(t, f)
	// The kernel sends its FORGETs after drop_caches returns, and the
	// server applies them as they come: wait for them.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		dropCaches(t)
		if liveNodes(&f.Inode) <= base+2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if peak < len(want) {
		t.Errorf("%d nodes after a walk of %d paths: the walks made no nodes, the test proves nothing", peak, len(want))
	}
	last := heap()
	t.Logf("nodes: %d before, %d after a walk, %d at the end; heap %d after 3 rounds, %d after %d", base, peak, liveNodes(&f.Inode), first, last, rounds)
	if n := liveNodes(&f.Inode); n > base+2 {
		t.Errorf("%d nodes live after the kernel forgot everything, %d before the walks", n, base)
	}
	if last > first+first/2+(4<<20) {
		t.Errorf("heap grew from %d to %d bytes over %d rounds", first, last, rounds-3)
	}
}

// walkQuiet is walk without a *testing.T, for goroutines; nil on error.
func walkQuiet(mnt string) []string {
	got, err := walkPaths(mnt)
	if err != nil {
		return nil
	}
	return got
}
