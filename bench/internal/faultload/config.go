package faultload

import (
	"fmt"
	"strings"
)

// Policy is the waypoint's Rego policy of the fault runs: it allows the
// frontend's reads and adds the revision marker rev-N to every request it
// allows (x-policy-revision), which the echo returns, so each answer shows
// which revision decided it.
func Policy(rev int) string {
	return strings.ReplaceAll(`package envoy.authz

default allow := {"allowed": false, "http_status": 403, "body": "denied\n"}

allow := {"allowed": true, "headers": {"x-policy-revision": "read,rev-REV"}} if {
	input.attributes.source.principal == "spiffe://cluster.local/ns/web/sa/frontend"
	input.attributes.request.http.method in {"GET", "HEAD"}
}
`, "REV", fmt.Sprint(rev))
}

// Route is the HTTPRoute of Service shop/reviews: weights for Services
// reviews-v1 and reviews-v2, extra rules before that one (ExtraRule), and
// the retry stanza of every rule (RetryOn5xx, or "" for none: the standard
// channel's CRDs have no retry field; the waypoint then retries a connect
// failure once on another endpoint).
func Route(v1, v2 int, extra, retry string) string {
	return fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: reviews, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, port: 80}]
  rules:%s
  - backendRefs: [{name: reviews-v1, port: 80, weight: %d}, {name: reviews-v2, port: 80, weight: %d}]
%s`, extra, v1, v2, retry)
}

// SingleBackendRoute sends everything to Service shop/reviews, whose
// endpoints (v1, v2) the waypoint balances and retries across.
func SingleBackendRoute(retry string) string {
	return `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: reviews, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, port: 80}]
  rules:
  - backendRefs: [{name: reviews, port: 80}]
` + retry
}

// RetryOn5xx is the retry stanza of the local runs' routes (experimental
// channel: attempts and codes).
const RetryOn5xx = "    retry: {attempts: 2, codes: [502, 503]}\n"

// ExtraRule routes a header to v2 only (the "new rule" of the route edit).
const ExtraRule = `
  - matches: [{headers: [{name: x-version, value: v2}]}]
    backendRefs: [{name: reviews-v2, port: 80}]`
