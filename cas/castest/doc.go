// Package castest is the conformance suite every cas.Store passes: the disk
// store, the in-memory fake and, later, the remote tiers. Run it from the
// implementation's tests:
//
//	func TestConformance(t *testing.T) {
//		castest.Run(t, func(t *testing.T) cas.Store { return newStore(t) })
//	}
//
// The suite checks only what the contract in cas/store.go promises, plus two
// things it needs a harness to observe: corruption (the store returned by
// newStore may implement Corrupter) and temp-file hygiene after failed Puts
// (TempFiler). Subtests that need a hook the store lacks are skipped, saying
// so. Randomized content comes from a seed the suite logs; set
// ESF_CASTEST_SEED to replay it.
//
// newStore is called once per subtest and must return an empty store whose
// resources the test's cleanup releases. Subtests run sequentially; the
// concurrency subtests start their own goroutines and wait for all of them.
package castest
