// Package ui serves esf's web view (esfctl ui): a single page, embedded in
// the binary, that shows groups, a group's search tree, a node's record,
// the diff of two nodes and a node's files, follows the event stream, and
// forks, promotes and prunes after a confirmation.
//
// The page talks only to this package's server, which calls esfd through
// the same client.Client as every esfctl verb; nothing is loaded from the
// network. Every request needs the random token printed with the URL
// (first as ?token=, then as the cookie the first answer sets), and its
// Host must be a loopback name, so neither another local user's browser
// tab nor a DNS-rebinding page can read or change the graph. Mutations
// also need the X-Esf-UI header, which a cross-site form cannot send.
package ui
