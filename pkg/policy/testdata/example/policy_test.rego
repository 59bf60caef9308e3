package envoy.authz_test

import data.envoy.authz

frontend := "spiffe://cluster.local/ns/shop/sa/frontend"

checkout := "spiffe://cluster.local/ns/shop/sa/checkout"

test_frontend_may_call_checkout if {
	authz.allow.allowed with input as {
		"source_principal": frontend,
		"destination_principal": checkout,
		"attributes": {"request": {"http": {"method": "POST", "path": "/orders"}}},
		"parsed_path": ["orders"],
	}
}

test_other_workload_denied if {
	not authz.allow.allowed with input as {
		"source_principal": "spiffe://cluster.local/ns/shop/sa/ads",
		"destination_principal": checkout,
		"attributes": {"request": {"http": {"method": "POST", "path": "/orders"}}},
		"parsed_path": ["orders"],
	}
}

test_unauthenticated_caller_with_identity_headers_denied if {
	not authz.allow.allowed with input as {
		"destination_principal": checkout,
		"attributes": {"request": {"http": {
			"method": "POST",
			"path": "/orders",
			"headers": {
				"x-forwarded-client-cert": sprintf("URI=%s", [frontend]),
				"forwarded": sprintf("for=127.0.0.1;by=%s", [frontend]),
			},
		}}},
		"parsed_path": ["orders"],
	}
}

test_health_check_is_public if {
	authz.allow.allowed with input as {
		"destination_principal": checkout,
		"attributes": {"request": {"http": {"method": "GET", "path": "/healthz"}}},
		"parsed_path": ["healthz"],
	}
}

test_denial_explains if {
	d := authz.allow with input as {"parsed_path": ["orders"]}
	d.http_status == 403
	d.body == "denied by mesh policy\n"
}
