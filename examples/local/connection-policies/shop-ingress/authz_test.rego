package envoy.authz_test

import data.envoy.authz

waypoint := {
	"attributes": {"source": {"principal": "spiffe://cluster.local/ns/shop/sa/waypoint"}},
	"from_waypoint": true,
	"destination_services": ["reviews.shop.svc.cluster.local"],
}

test_through_the_waypoint if authz.allow with input as waypoint

test_not_from_the_waypoint if not authz.allow with input as object.union(waypoint, {"from_waypoint": false})

test_port_no_service_exposes if not authz.allow with input as object.remove(waypoint, ["destination_services"])
