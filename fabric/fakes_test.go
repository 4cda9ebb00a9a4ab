package fabric

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/cas"
	casmem "github.com/esf-dev/esf/cas/mem"
	"github.com/esf-dev/esf/cas/s3"
	"github.com/esf-dev/esf/errdefs"
	"github.com/esf-dev/esf/executor/fake"
	journalmem "github.com/esf-dev/esf/journal/mem"
)

// openFakes opens a fabric on in-memory content (cas/mem) and state plane
// (journal/mem) and the fake executor, for logic tests that prove no
// requirement of a real component: they run as any user, in milliseconds.
// opts.Now, if set, is the journal's clock too.
func openFakes(t *testing.T, opts Options) *Fabric {
	t.Helper()
	opts.StateDir = t.TempDir()
	opts.CAS = casmem.New()
	opts.JournalStore = journalmem.New(journalmem.Options{Now: opts.Now})
	opts.Executor = fake.New()
	f, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.StopAll(context.Background()); err != nil {
			t.Errorf("StopAll: %v", err)
		}
		f.Close()
	})
	return f
}

// TestOpenOnGivenStores: with Options.CAS and JournalStore the fabric
// keeps content and state where it is told, and makes no store of its own
// in the state dir.
func TestOpenOnGivenStores(t *testing.T) {
	f := openFakes(t, Options{})
	g := newGroup(t, f, map[string]string{"a": "1", "d/b": "2"})
	root, err := cas.ParseID(g.Node.RootID)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := f.opts.CAS.Has(context.Background(), root); err != nil || !ok {
		t.Fatalf("the imported root is not in the given store: %v %v", ok, err)
	}
	for _, d := range []string{"cas", "journal"} {
		if _, err := os.Stat(filepath.Join(f.StateDir(), d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s in the state dir with given stores: %v", d, err)
		}
	}
	// A given store and a remote (whose cache is the local store) do not
	// go together.
	o := Options{StateDir: t.TempDir(), CAS: casmem.New(), Remote: &s3.Store{}}
	if err := o.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("CAS and Remote: %v", err)
	}
}
