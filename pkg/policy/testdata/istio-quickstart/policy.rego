# The policy of OPA-Envoy's Istio quick start (examples/istio/quick_start.yaml
# in open-policy-agent/opa-envoy-plugin, Apache-2.0), kept verbatim below this
# comment: existing OPA-Envoy policies must work unchanged. Decision path:
# istio/authz/allow.
package istio.authz

import input.attributes.request.http as http_request
import input.parsed_path

default allow = false

allow if {
    parsed_path[0] == "health"
    http_request.method == "GET"
}

allow if {
    roles_for_user[r]
    required_roles[r]
}

roles_for_user contains r if {
    r := user_roles[user_name][_]
}

required_roles contains r if {
    perm := role_perms[r][_]
    perm.method = http_request.method
    perm.path = http_request.path
}

user_name = parsed if {
    [_, encoded] := split(http_request.headers.authorization, " ")
    [parsed, _] := split(base64url.decode(encoded), ":")
}

user_roles = {
    "alice": ["guest"],
    "bob": ["admin"]
}

role_perms = {
    "guest": [
        {"method": "GET",  "path": "/productpage"},
    ],
    "admin": [
        {"method": "GET",  "path": "/productpage"},
        {"method": "GET",  "path": "/api/v1/products"},
    ],
}
