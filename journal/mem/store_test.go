package mem_test

import (
	"testing"

	"github.com/esf-dev/esf/journal"
	"github.com/esf-dev/esf/journal/journaltest"
	"github.com/esf-dev/esf/journal/mem"
)

func TestConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T, o journaltest.Options) journal.Store {
		return mem.New(mem.Options{Now: o.Now, Failpoint: o.Failpoint})
	})
}
