# Authorization for the shop namespace's waypoint. The input is OPA-Envoy's
# (input.attributes...); source.principal is absent for callers the mesh could
# not authenticate (the hairpin of a client outside the mesh).
package envoy.authz

frontend := "spiffe://cluster.local/ns/web/sa/frontend"

admin := "spiffe://cluster.local/ns/web/sa/admin"

default allow := {"allowed": false, "http_status": 403, "body": "denied: no rule allows this request\n"}

allow := {"allowed": true, "headers": {"x-causeway-policy": concat(",", sort(allowed_by))}} if count(allowed_by) > 0

allow := {"allowed": false, "http_status": 403, "body": sprintf("denied: %s\n", [concat("; ", sort(deny_reasons))])} if {
	count(allowed_by) == 0
	count(deny_reasons) > 0
}

principal := input.attributes.source.principal

method := input.attributes.request.http.method

# Reads by the frontend.
allowed_by contains "frontend-read" if {
	principal == frontend
	method in {"GET", "HEAD"}
}

# gRPC calls (always POST) from the frontend to the ratings service.
allowed_by contains "frontend-grpc" if {
	principal == frontend
	input.parsed_path[0] == "shop.Ratings"
}

# The admin may write.
allowed_by contains "admin-write" if {
	principal == admin
	method in {"GET", "HEAD", "POST", "PUT", "DELETE"}
}

# Anyone, even unauthenticated, may read /public.
allowed_by contains "public" if {
	method == "GET"
	input.parsed_path[0] == "public"
}

deny_reasons contains "only the admin identity may write" if {
	principal
	not method in {"GET", "HEAD"}
	not input.parsed_path[0] == "shop.Ratings"
}

deny_reasons contains "unauthenticated callers may only read /public" if {
	not principal
}
