package workspacetest

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sync"
	"testing"

	"github.com/esf-dev/esf/sandbox"
	"github.com/esf-dev/esf/workspace"
)

// workers is how many goroutines the concurrency checks run at once.
const workers = 8

// testConcurrency: one session serves Runs and file operations from many
// goroutines at once; concurrent replaces of one file are atomic (every
// read sees one writer's content whole); sessions created concurrently are
// isolated from one another.
func (s *suite) testConcurrency(t *testing.T) {
	t.Run("OneSession", func(t *testing.T) {
		sess := s.create(t, nil)
		cwd := s.pwd(t, sess)
		ctx := s.ctx(t)
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() {
				for k := range 3 {
					name := fmt.Sprintf("wst-conc/w%d.txt", i)
					data := bytes.Repeat([]byte(fmt.Sprintf("worker %d round %d\n", i, k)), 100+i)
					if err := sess.Write(ctx, name, data); err != nil {
						t.Errorf("worker %d: Write: %v", i, err)
						return
					}
					if got, err := sess.Read(ctx, name); err != nil || !bytes.Equal(got, data) {
						t.Errorf("worker %d: Read = %d bytes, %v; want its own %d bytes", i, len(got), err, len(data))
					}
					res, err := sess.Run(ctx, sandbox.Spec{Env: map[string]string{"WST_WORKER": fmt.Sprint(i)}}, "cat "+name+`; echo "w=$WST_WORKER"`)
					if want := string(data) + fmt.Sprintf("w=%d\n", i); err != nil || string(res.Stdout) != want {
						t.Errorf("worker %d: Run = %q, %v; want %q", i, clip(res.Stdout), err, clip(want))
					}
					up := genBytes(s.seed+uint64(i), uint64(100+k), 256<<10)
					uname := fmt.Sprintf("wst-conc/u%d.bin", i)
					if err := sess.Upload(ctx, uname, bytes.NewReader(up)); err != nil {
						t.Errorf("worker %d: Upload: %v", i, err)
						return
					}
					rc, err := sess.Download(ctx, uname)
					if err != nil {
						t.Errorf("worker %d: Download: %v", i, err)
						return
					}
					var got bytes.Buffer
					_, err = got.ReadFrom(rc)
					rc.Close()
					if err != nil || !bytes.Equal(got.Bytes(), up) {
						t.Errorf("worker %d: Download = %d bytes, %v; want its own %d bytes", i, got.Len(), err, len(up))
					}
					if ps, err := sess.Glob(ctx, "wst-conc/*"); err != nil || !slices.Contains(ps, path.Join(cwd, name)) {
						t.Errorf("worker %d: Glob = %q, %v; want %s among them", i, ps, err, path.Join(cwd, name))
					}
					if fi, err := sess.List(ctx, name); err != nil || len(fi) != 1 {
						t.Errorf("worker %d: List(%s) = %+v, %v", i, name, fi, err)
					}
				}
			})
		}
		wg.Wait()
	})

	t.Run("SameFile", func(t *testing.T) {
		sess := s.create(t, nil)
		ctx := s.ctx(t)
		const p, size = "wst-conc/shared.bin", 128 << 10
		content := func(i int) []byte { return bytes.Repeat([]byte{byte('A' + i)}, size) }
		if err := sess.Write(ctx, p, content(0)); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() {
				for k := range 6 {
					if i%2 == 0 { // writers: half by Write, half by Upload
						var err error
						if k%2 == 0 {
							err = sess.Write(ctx, p, content(i))
						} else {
							err = sess.Upload(ctx, p, bytes.NewReader(content(i)))
						}
						if err != nil {
							t.Errorf("writer %d: %v", i, err)
						}
						continue
					}
					got, err := sess.Read(ctx, p)
					if err != nil {
						t.Errorf("reader %d: Read: %v", i, err)
						continue
					}
					if len(got) != size || !bytes.Equal(got, bytes.Repeat(got[:1], size)) {
						t.Errorf("reader %d: read %d bytes that are not one writer's content whole (atomic replace broken)", i, len(got))
					}
				}
			})
		}
		wg.Wait()
	})

	t.Run("Sessions", func(t *testing.T) {
		const n = 3
		sessions := make([]workspace.Session, n)
		var wg sync.WaitGroup
		var mu sync.Mutex
		for i := range n {
			wg.Go(func() {
				sess, err := s.h.Provider.Create(s.ctx(t), s.spec(t))
				if err != nil {
					t.Errorf("concurrent Create %d: %v", i, err)
					return
				}
				mu.Lock()
				sessions[i] = sess
				mu.Unlock()
			})
		}
		wg.Wait()
		for _, sess := range sessions {
			if sess != nil {
				t.Cleanup(func() { s.closeQuietly(t, sess) })
			}
		}
		if t.Failed() {
			return
		}
		ctx := s.ctx(t)
		ids := map[string]bool{}
		for i, sess := range sessions {
			ids[sess.ID()] = true
			if err := sess.Write(ctx, "wst-isolation.txt", []byte(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
			if err := sess.Write(ctx, fmt.Sprintf("wst-only-%d.txt", i), []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		if len(ids) != n {
			t.Fatalf("%d concurrent Creates returned %d distinct ids", n, len(ids))
		}
		for i, sess := range sessions {
			if got, err := sess.Read(ctx, "wst-isolation.txt"); err != nil || string(got) != fmt.Sprint(i) {
				t.Errorf("session %d reads %q, %v from its own file; sessions share files", i, got, err)
			}
			for j := range n {
				if j == i {
					continue
				}
				_, err := sess.Read(ctx, fmt.Sprintf("wst-only-%d.txt", j))
				wantErr(t, fmt.Sprintf("session %d reading session %d's file", i, j), err, fs.ErrNotExist)
			}
		}
	})
}
