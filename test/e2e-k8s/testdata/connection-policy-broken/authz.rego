# The connection policy set "e2e-broken" of the e2e install: it does not
# compile (the rule's body never closes), so the control plane never has a
# good revision of it and the webhook refuses ConnectionPolicies naming it.
package envoy.authz

allow if {
	input.attributes.source.principal ==
