# Example waypoint policy: which workloads may call which, by the SPIFFE IDs
# the mesh authenticated (never by headers), plus an open health check.
# Decision path: envoy/authz/allow (the default).
package envoy.authz

import input.attributes.request.http as request

# Destination identity -> identities allowed to call it.
allowed_callers := {"spiffe://cluster.local/ns/shop/sa/checkout": {"spiffe://cluster.local/ns/shop/sa/frontend"}}

default allow := {
	"allowed": false,
	"http_status": 403,
	"body": "denied by mesh policy\n",
	"headers": {"content-type": "text/plain"},
}

allow := {"allowed": true, "headers": {"x-authz-policy": "example"}} if {
	public_health_check
}

allow := {"allowed": true, "headers": {"x-authz-policy": "example"}} if {
	caller_allowed
}

public_health_check if {
	request.method == "GET"
	input.parsed_path == ["healthz"]
}

# source_principal is absent for TLS-only tunnels, so this cannot hold for them.
caller_allowed if {
	input.source_principal in allowed_callers[input.destination_principal]
}
