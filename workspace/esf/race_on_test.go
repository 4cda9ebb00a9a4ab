//go:build race

package esf

// raceEnabled: the race detector slows the tests' own data generation and
// hashing tenfold, so the big transfers shrink under it.
const raceEnabled = true
