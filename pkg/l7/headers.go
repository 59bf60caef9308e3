package l7

import (
	"net/http"
	"strings"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// Header rules every upstream request follows: identity claims removed and
// the identity set from the tunnel's peer only, forwarding headers, an
// allow's header changes, and what of the caller's fields is carried on.

// SourcePrincipalHeader carries the caller's authenticated identity to the
// destination. The waypoint removes it from every incoming request and sets
// it only from the tunnel's authenticated peer, so the destination can trust
// it because it arrived from the waypoint.
const SourcePrincipalHeader = "X-Causeway-Source-Principal"

// identityHeaders are request headers that claim a client identity. They are
// removed from every request before routing and authorization: an identity
// comes from the tunnel's certificate and nothing else. Headers with the
// X-Causeway- prefix are reserved for the mesh and removed as well.
var identityHeaders = map[string]bool{
	"X-Forwarded-Client-Cert":  true, // Envoy XFCC
	"Client-Cert":              true, // RFC 9440
	"Client-Cert-Chain":        true, // RFC 9440
	"X-Client-Cert":            true,
	"X-Ssl-Client-Cert":        true,
	"Ssl-Client-Cert":          true,
	"X-Ssl-Client-Dn":          true,
	"X-Ssl-Client-Verify":      true,
	"X-Envoy-Peer-Metadata":    true,
	"X-Envoy-Peer-Metadata-Id": true,
	"X-Istio-Attributes":       true,
}

const reservedPrefix = "X-Causeway-"

// sanitizeIdentity removes identity claims from a header map: the identity
// headers, the mesh's reserved ones, and any name that reads as one of
// those, or as a forwarding or framing field, once its '_' are taken for
// '-'. Upstreams that fold '_' into '-' (CGI, WSGI and Rack environments
// make both HTTP_X_...) would take such a field for the real one, which
// the waypoint sets or strips. Other names with '_' pass, as with Envoy's
// default headers_with_underscores_action.
func sanitizeIdentity(h http.Header) {
	for k := range h {
		if claimsIdentity(k) {
			delete(h, k)
		}
	}
}

// claimsIdentity reports whether the canonical header name k is one
// sanitizeIdentity removes.
func claimsIdentity(k string) bool {
	if identityHeaders[k] || strings.HasPrefix(k, reservedPrefix) {
		return true
	}
	if strings.IndexByte(k, '_') < 0 {
		return false
	}
	d := http.CanonicalHeaderKey(strings.ReplaceAll(k, "_", "-"))
	return identityHeaders[d] || strings.HasPrefix(d, reservedPrefix) || isForwarding(d) || h1.IsHopByHop(d) ||
		d == "Content-Length" || d == "Host"
}

// setForwarding adds the caller's address to X-Forwarded-For and Forwarded
// (after what earlier proxies wrote: that part is informational only), and
// passes X-Forwarded-Host and -Proto on from in.
func setForwarding(out *h1.Fields, in http.Header, t *tunnel) {
	if prior := in.Values("X-Forwarded-For"); len(prior) > 0 {
		out.Set("X-Forwarded-For", []string{strings.Join(prior, ", ") + ", " + t.forwardedFor})
	} else {
		out.Set("X-Forwarded-For", t.xffValues)
	}
	if prior := in.Values("Forwarded"); len(prior) > 0 {
		out.Set("Forwarded", []string{strings.Join(prior, ", ") + ", " + t.forwarded})
	} else {
		out.Set("Forwarded", t.forwardValues)
	}
	for _, k := range []string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v, ok := in[k]; ok {
			out.Set(k, v)
		}
	}
}

// setIdentity sets the identity header from the tunnel's peer, or removes
// it. Route filters and policy headers were applied after the request was
// sanitized: identity claims must not survive them either.
func setIdentity(l *h1.Fields, t *tunnel) {
	l.DeleteFunc(claimsIdentity)
	if t.identityValues != nil {
		l.Set(SourcePrincipalHeader, t.identityValues)
	}
}

// applyPolicyHeaders applies an allow's request header changes, last, as
// Envoy applies ext_authz's after its own forwarding headers. Hop-by-hop
// names are skipped: they describe the upstream connection, which is the
// proxy's. The values are shared, not copied (h1.Fields).
func applyPolicyHeaders(l *h1.Fields, remove []string, set http.Header) {
	for _, k := range remove {
		l.Del(http.CanonicalHeaderKey(k))
	}
	for k, vs := range set {
		k = http.CanonicalHeaderKey(k)
		if !h1.IsHopByHop(k) {
			l.Set(k, vs)
		}
	}
}

// upstreamBase appends to l the fields of in that an upstream request
// carries on: not hop-by-hop, not named by in's Connection header, not the
// forwarding headers the waypoint sets itself, not Expect (the caller's
// server answers 100-continue itself when the body is read, as Envoy does;
// the upstream gets the body without having to ask for it).
func upstreamBase(in http.Header, l h1.Fields) h1.Fields {
	for k, vv := range in {
		if !h1.IsHopByHop(k) && !isForwarding(k) && k != "Expect" {
			l = append(l, h1.Field{Name: k, Values: vv})
		}
	}
	for k := range h1.ConnectionOptions(in["Connection"]) {
		l.Del(k)
	}
	return l
}

// isForwarding reports whether the canonical header name k is one of the
// forwarding headers the waypoint sets itself (setForwarding).
func isForwarding(k string) bool {
	switch k {
	case "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto":
		return true
	}
	return false
}

// responseChanges are what the waypoint changes in a response to the
// caller: the route's ResponseHeaderModifiers, then CORS and policy
// headers.
type responseChanges struct {
	mods    []*headerMod
	headers http.Header // CORS and policy headers
}

func (c *responseChanges) none() bool { return len(c.mods) == 0 && len(c.headers) == 0 }

// add adds h to the headers set on the response: replacing an earlier
// value (set), or after it.
func (c *responseChanges) add(h http.Header, set bool) {
	if c.headers == nil {
		c.headers = make(http.Header, len(h))
	}
	for k, vs := range h {
		k = http.CanonicalHeaderKey(k)
		if set {
			c.headers[k] = append([]string(nil), vs...)
		} else {
			c.headers[k] = append(c.headers[k], vs...)
		}
	}
}

// apply applies the changes to a response's headers.
func (c *responseChanges) apply(h http.Header) {
	for _, m := range c.mods {
		m.apply(h)
	}
	for k, vs := range c.headers {
		if k == "Vary" {
			h[k] = append(h[k], vs...)
			continue
		}
		h[k] = vs
	}
}
