package runc

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc/runctest"
)

// TestStopWithoutRunc: Stop kills the init itself, awaits its end on a
// pidfd and removes the container without runc delete (stop.go), also
// when the container's processes ignore every signal they can and fork as
// fast as the pids limit lets them, and when it is frozen. Afterwards no
// process of it is alive, and its cgroups, runc's state and the bundle
// are gone; the exec in flight ends.
func TestStopWithoutRunc(t *testing.T) { coldAndPooled(t, testStopWithoutRunc) }

func testStopWithoutRunc(t *testing.T, opts Options) {
	for _, frozen := range []bool{false, true} {
		t.Run(fmt.Sprintf("frozen=%v", frozen), func(t *testing.T) {
			v := newEnvWith(t, opts)
			const id = "bomb"
			v.start(id, executor.Spec{Limits: executor.Limits{Pids: 32}})
			var out syncBuffer
			bomb := `trap '' HUP INT QUIT TERM USR1 USR2; echo up; while :; do sh -c "trap '' HUP INT QUIT TERM; exec sleep 1000" & done`
			p, err := v.e.Exec(v.ctx, id, executor.ExecSpec{Args: []string{"sh", "-c", bomb}, Stdout: &out})
			if err != nil {
				t.Fatal(err)
			}
			out.waitFor(t, "up")
			// Until the pids limit holds it back: many processes, and
			// one forking all the time.
			deadline := time.Now().Add(2 * time.Minute)
			var procs []procStat
			for procs = v.containerPids(t, id); len(procs) < 16; procs = v.containerPids(t, id) {
				if time.Now().After(deadline) {
					t.Fatalf("the fork bomb made only %d processes", len(procs))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if frozen {
				if err := v.e.Freeze(v.ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			rid := v.e.runcID(id)
			before := v.e.runcDeletes.Load()
			if err := v.e.Stop(v.ctx, id); err != nil {
				t.Fatal(err)
			}
			if n := v.e.runcDeletes.Load() - before; n != 0 {
				t.Errorf("Stop left the container to runc delete (%d)", n)
			}
			for _, q := range procs {
				// The init may stay a zombie until its parent (not us)
				// reaps it; every other process was reaped before it.
				if st, err := readStat(q.pid); err == nil && st.start == q.start && st.state != 'Z' {
					t.Errorf("process %d (state %c) outlived Stop", q.pid, st.state)
				}
			}
			for _, d := range append(cgroupDirs(v.e.opts.Namespace, rid), filepath.Join(v.e.Root(), rid), v.e.bundle(id)) {
				if _, err := os.Stat(d); err == nil {
					t.Errorf("%s outlived Stop", d)
				}
			}
			done := make(chan struct{})
			go func() {
				p.Wait()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("the exec's Wait did not return after Stop")
			}
		})
	}
}

// TestPool_Soak: many adopt → exec → Stop cycles through a small pool,
// two clients at once (each on its own root), leave nothing behind: no container, bundle, stub,
// process, cgroup or mount (the env's checks, and the mount table), and
// no goroutine (TestMain). Evidence for the pool's default (esfd
// --runc-pool).
func TestPool_Soak(t *testing.T) {
	v := newEnvWith(t, Options{PoolSize: 2})
	mounts := func() int {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), v.dir)
	}
	before := mounts()
	const clients, cycles = 2, 12
	var wg sync.WaitGroup
	errs := make(chan error, clients*cycles)
	for c := range clients {
		// A root per client, as every attempt has its own: Stop removes
		// the mountpoints its container made there.
		rootfs := filepath.Join(v.dir, fmt.Sprintf("rootfs-%d", c))
		if err := runctest.Busybox(rootfs); err != nil {
			t.Fatal(err)
		}
		v.mu.Lock()
		v.roots = append(v.roots, rootfs)
		v.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range cycles {
				id := fmt.Sprintf("soak-%d-%d", c, i)
				if err := v.e.Start(v.ctx, id, executor.Spec{Rootfs: rootfs, Limits: executor.Limits{Pids: 64}}); err != nil {
					errs <- err
					return
				}
				var out syncBuffer
				p, err := v.e.Exec(v.ctx, id, executor.ExecSpec{Args: []string{"sh", "-c", "echo $$ > /tmp/" + id + "; cat /tmp/" + id}, Stdout: &out})
				if err == nil {
					var code int
					if code, err = p.Wait(); err == nil && code != 0 {
						err = fmt.Errorf("exec in %s: exit %d", id, code)
					}
				}
				if serr := v.e.Stop(v.ctx, id); err == nil {
					err = serr
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := v.e.PoolAdopted(); n == 0 {
		t.Errorf("no Start adopted a pool container")
	}
	if err := v.e.ClosePool(v.ctx); err != nil {
		t.Fatal(err)
	}
	if after := mounts(); after != before {
		t.Errorf("mounts under the test's dir: %d before, %d after", before, after)
	}
	// Every container's cgroup (adopted ones are named by the pool's
	// runc id) lies below the namespace's: none may be left.
	for _, d := range cgroupDirs(v.e.opts.Namespace, "") {
		ents, _ := os.ReadDir(d)
		for _, c := range ents {
			if c.IsDir() {
				t.Errorf("cgroup left: %s", filepath.Join(d, c.Name()))
			}
		}
	}
	t.Logf("%d of %d Starts adopted", v.e.PoolAdopted(), clients*cycles)
}
