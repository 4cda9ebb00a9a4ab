package journal

import "github.com/esf-dev/esf/journal/failpoint"

// The failpoints every Store implementation evaluates in Update, through its
// Options' hook (failpoint.Inject by default). With the crash action they
// cut an Update before its transaction runs, between the end of fn and the
// durable commit (nothing of fn may survive), and just after the commit
// (everything of fn must survive, though the caller never heard so).
const (
	FailpointUpdateBegin        = "journal.update.begin"
	FailpointUpdateBeforeCommit = "journal.update.before-commit"
	FailpointUpdateAfterCommit  = "journal.update.after-commit"
)

func init() {
	failpoint.Declare(FailpointUpdateBegin)
	failpoint.Declare(FailpointUpdateBeforeCommit)
	failpoint.Declare(FailpointUpdateAfterCommit)
}
