// Package workspacetest is the conformance suite every workspace.Provider
// runs: the fake, esf itself, and each remote adapter against its offline
// fake server (and, opt-in, the live service). Run(t, Harness) drives it.
package workspacetest
