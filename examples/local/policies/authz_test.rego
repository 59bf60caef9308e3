package envoy.authz_test

import data.envoy.authz

req(principal, method, path) := {
	"attributes": {
		"source": {"principal": principal},
		"request": {"http": {"method": method, "path": path}},
	},
	"parsed_path": split(trim_prefix(path, "/"), "/"),
}

anonymous(method, path) := {"attributes": {"request": {"http": {"method": method, "path": path}}}, "parsed_path": split(trim_prefix(path, "/"), "/")}

test_frontend_may_read if {
	authz.allow.allowed with input as req("spiffe://cluster.local/ns/web/sa/frontend", "GET", "/reviews/1")
}

test_frontend_may_not_write if {
	d := authz.allow with input as req("spiffe://cluster.local/ns/web/sa/frontend", "POST", "/reviews")
	not d.allowed
	d.http_status == 403
	contains(d.body, "only the admin identity may write")
}

test_frontend_grpc_ratings if {
	authz.allow.allowed with input as req("spiffe://cluster.local/ns/web/sa/frontend", "POST", "/shop.Ratings/Get")
}

test_admin_may_write if {
	authz.allow.allowed with input as req("spiffe://cluster.local/ns/web/sa/admin", "POST", "/reviews")
}

test_unauthenticated_denied if {
	d := authz.allow with input as anonymous("GET", "/reviews/1")
	not d.allowed
	contains(d.body, "unauthenticated")
}

test_unauthenticated_public_allowed if {
	authz.allow.allowed with input as anonymous("GET", "/public/catalog")
}

test_unauthenticated_may_not_post_public if {
	not authz.allow.allowed with input as anonymous("POST", "/public/catalog")
}

test_other_identity_denied if {
	not authz.allow.allowed with input as req("spiffe://cluster.local/ns/shop/sa/reviews", "GET", "/reviews/1")
}

test_frontend_public_read_names_both_rules if {
	d := authz.allow with input as req("spiffe://cluster.local/ns/web/sa/frontend", "GET", "/public/x")
	d.allowed
	d.headers["x-causeway-policy"] == "frontend-read,public"
}
