# Tunnels into the shop waypoint, checked as each opens, before any HTTP
# is parsed (ConnectionPolicy shop/waypoint-tunnels in connection-policies.yaml): callers
# from the web namespace, and callers without identity (the hairpin from
# outside the mesh), whom the request policy then judges per request.
package envoy.authz

default allow := false

allow if startswith(input.attributes.source.principal, "spiffe://cluster.local/ns/web/sa/")

allow if not input.attributes.source.principal
