// Package policy authorizes requests with OPA/Rego the way OPA-Envoy does,
// without Envoy: the waypoint builds the ext_authz v3 input document
// directly as an OPA value (BuildInput; inputdoc.go builds only the values
// a cached decision needs), the Engine evaluates a prepared query against
// the active policy set (Decide) and reads the result as OPA-Envoy does
// (boolean or {allowed, headers, ...}), failing closed.
//
// Policy sets come from a directory of Rego v1 files or a Git repository
// fetched in process (a Remote: package policygit, every revision a
// commit), and optionally an OPA bundle service (a Feed: package
// policybundle). Both are packages of their own so that the node proxy,
// which compiles only the connection policies xDS hands it, links neither
// go-git nor OPA's downloader. A set is compiled, its *_test.rego
// tests run and its decision query prepared off the request path; only then
// is it swapped in atomically. A set that does not parse, compile or pass its
// tests is rejected with a logged reason and the last good one stays active.
// A set's results are reused for requests that agree on every input value
// the set reads, when nothing else can change them (decisioncache.go).
// Decisions are logged asynchronously with credentials masked.
package policy
