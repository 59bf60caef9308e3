package envoy.authz_test

import data.envoy.authz

test_allowed if {
	authz.allow with input as {"attributes": {"source": {"principal": "spiffe://cluster.local/ns/a/sa/allowed"}}, "destination_workload": {"namespace": "a"}}
}

test_other_account_denied if {
	not authz.allow with input as {"attributes": {"source": {"principal": "spiffe://cluster.local/ns/a/sa/default"}}, "destination_workload": {"namespace": "a"}}
}

test_other_namespace_denied if {
	not authz.allow with input as {"attributes": {"source": {"principal": "spiffe://cluster.local/ns/b/sa/allowed"}}, "destination_workload": {"namespace": "a"}}
}

test_unauthenticated_denied if {
	not authz.allow with input as {"attributes": {"source": {}}, "destination_workload": {"namespace": "a"}}
}
