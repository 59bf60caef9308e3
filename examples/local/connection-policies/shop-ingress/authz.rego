# Connections into the shop namespace, checked by each pod's node proxy
# (ConnectionPolicy shop/ingress in connection-policies.yaml): only through the
# namespace's own waypoint, and only to a port a Service exposes.
package envoy.authz

default allow := false

allow if {
	input.from_waypoint
	count(input.destination_services) > 0
}
