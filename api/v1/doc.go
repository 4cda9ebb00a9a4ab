// Package v1 holds the request and response bodies of esfd's /v1 API: what
// crosses the wire, and nothing else. It imports only the standard library
// and errdefs, so a client (esfctl, api/client, workspace/esf) links none of
// the daemon. The daemon converts between its records (journal, fabric)
// and these views in one place (api/convert.go): the records on disk may
// change without changing /v1, and the other way round.
//
// Field names are the spec's (snake_case, root_id, ...) and never change
// meaning; docs/openapi.yaml describes the same shapes.
package v1
