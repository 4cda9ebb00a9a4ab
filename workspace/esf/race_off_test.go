//go:build !race

package esf

const raceEnabled = false
