# An OPA-Envoy policy whose decision is an object at a path of its own
# (data.envoy.http.public.decision), named by the causeway-policy.yaml next
# to it: requests under /public are allowed with a header for the upstream,
# others get the policy's own status and body.
package envoy.http.public

default decision := {"allowed": false, "http_status": 451, "body": "not here\n"}

decision := {"allowed": true, "headers": {"x-ext-auth-allow": "yes"}} if input.parsed_path[0] == "public"
