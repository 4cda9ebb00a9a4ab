package fake_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/executortest"
	"github.com/esf-dev/esf/executor/fake"
)

func TestConformance(t *testing.T) {
	executortest.Run(t, executortest.Harness{
		New: func(t *testing.T) executor.Executor { return fake.New() },
		Rootfs: func(t *testing.T) string {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o777); err != nil {
				t.Fatal(err)
			}
			return dir
		},
		CheckClean: func(t *testing.T, e executor.Executor) {
			if n := e.(*fake.Executor).Live(); n != 0 {
				t.Errorf("%d execs still running after every container stopped", n)
			}
		},
	})
}
