package envoy.authz_test

import data.envoy.authz

test_web if authz.allow with input as {"attributes": {"source": {"principal": "spiffe://cluster.local/ns/web/sa/frontend"}}}

test_unauthenticated if authz.allow with input as {"attributes": {"source": {}}}

test_other_namespace if not authz.allow with input as {"attributes": {"source": {"principal": "spiffe://cluster.local/ns/shop/sa/reviews"}}}
