// Package l7 is the waypoint's HTTP engine: it serves HTTP/1.1, HTTP/2 and
// gRPC inside HBONE tunnels, routes with Gateway API HTTPRoute/GRPCRoute
// semantics, applies filters, asks an Authorizer, balances over endpoints
// (least outstanding requests, power of two choices) and forwards over
// pooled HTTP connections through tunnels a Dialer opens.
//
// The waypoint compiles its xDS resources with Compile, installs the result
// with Engine.Update (atomic; requests in flight finish on the configuration
// they started with), and hands every accepted tunnel that carries an HTTP
// port to Engine.ServeConn. An ingress gateway compiles its listeners with
// CompileGateway and marks its connections ConnInfo.Ingress: requests are
// routed by the listener their port and host select.
//
// Where Gateway API leaves behaviour to the implementation:
//   - RegularExpression paths (RE2, whole path) rank with PathPrefix by
//     length, after a prefix of equal length; Exact ranks first.
//   - Routing, authorization and the upstream all see the request path in
//     RFC 3986 normal form (dot segments removed, unreserved escapes decoded,
//     %2F kept), so a path cannot be routed or authorized as something other
//     than what the backend serves.
//   - Without a retry stanza a connect failure (nothing sent) is retried once
//     on another endpoint; with one, attempts default to 1, backoff to 25 ms
//     (doubling, up to 10x, with jitter), codes to 500, 502, 503, 504; a retry
//     that could not finish inside the request timeout is not started.
//     Retries go only to endpoints with the identity the request was
//     authorized for, and need a fully buffered body (or, after a connect
//     failure, a streamed body none of which was sent yet).
//   - Redirects, CORS preflights and local errors are answered without
//     asking the Authorizer: they reach no workload.
//   - Local replies to gRPC requests are gRPC statuses (trailers-only);
//     logs and metrics record the HTTP status chosen.
package l7

// The files, each using only those listed before it (hack/filedeps prints
// what each uses):
//
//	path.go      request paths in normal form
//	match.go     the request view routing reads; compiled matches, hostnames
//	service.go   services, ports, protocols, backend destinations, targets
//	filter.go    route filters: what each is and does
//	compile.go   Config: routes compiled into tables; route lookup; weights
//	gateway.go   an ingress gateway's Config: listener tables, backends through waypoints
//	dump.go      the compiled configuration as JSON
//	authz.go     the Authorizer's interface
//	upstream.go  endpoints, their connection pools, health and balancing
//	metrics.go   the metric vectors, Istio's standard ones too
//	tunnel.go    a served tunnel and what its requests share
//	headers.go   identity and forwarding header rules; response changes
//	body.go      request and response bodies as the exchange wraps them
//	record.go    what the access log and metrics are made of; the caller's writer
//	engine.go    Options, Engine, configuration updates
//	exchange.go  one request's state
//	trace.go     a request's server span and its attempts' client spans
//	observe.go   a request's metrics (their labels) and access-log line
//	reply.go     what the waypoint answers itself
//	attempt.go   upstream attempts, retries and their timeouts
//	forward.go   the upstream request's head; the response copied back
//	mirror.go    request mirrors
//	proxy.go     a request's phases in order: normalize, route, policy, filters
//	upgrade.go   upgrades, through httputil.ReverseProxy
//	serve.go     NewEngine and ServeConn: tunnels in, HTTP/1.1 or HTTP/2
