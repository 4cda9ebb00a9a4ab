// Package cubesandbox is the workspace adapter for Tencent CubeSandbox, as
// a configuration profile of the E2B adapter (package e2b).
//
// CubeSandbox runs E2B's own envd in every sandbox and serves an
// E2B-compatible control plane (CubeAPI). Building a separate fake for it
// (package cubefake) and running the same conformance suite against both
// showed that every difference the adapter depends on is configuration or
// a tolerance the E2B adapter needs anyway:
//
//   - control-plane auth: "Authorization: Bearer" instead of X-API-Key
//     (CubeAPI accepts both; Bearer is what the Cube SDK sends);
//   - data plane: per-sandbox virtual hosts on plain HTTP port 80 behind
//     CubeProxy, optionally dialled at a node IP, instead of E2B's HTTPS
//     edge; the traffic token under cube-traffic-access-token as well as
//     e2b-traffic-access-token;
//   - user "root" (home /root) instead of "user"; no default template;
//   - connect answers 200 where E2B answers 201 after a resume, and pause
//     answers 204 before the sandbox is paused. The E2B adapter accepts
//     either status and confirms every pause by polling the sandbox's
//     state, which costs E2B one GET.
//
// The create and connect paths are the same (/sandboxes and
// /sandboxes/{id}/connect), as are the JSON shapes and the error body.
// So this package only translates Config (with the Cube SDK's environment
// variables and its E2B_* fallbacks) into e2b.Config; sessions are
// *e2b.Session. Should a live CubeSandbox disagree, the place to diverge
// is a field of e2b.Config, not a second envd client.
//
// CubeSandbox-only features (volumes, snapshots and rollback, network
// policy, the code interpreter on port 49999) stay out of the contract and
// out of this adapter.
package cubesandbox
