# The connection policy set "default" of the e2e install (the ConfigMap
# causeway-system/connection-policy-default): into a workload a
# ConnectionPolicy naming it selects, only the service account "allowed" of
# the workload's own namespace may connect.
package envoy.authz

default allow := false

allow if {
	input.attributes.source.principal == sprintf("spiffe://cluster.local/ns/%s/sa/allowed", [input.destination_workload.namespace])
}
