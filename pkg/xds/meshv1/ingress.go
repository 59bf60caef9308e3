package meshv1

import (
	"strings"

	"google.golang.org/protobuf/proto"
)

// HostRank says how closely a listener whose hostname is hostname serves
// host (a TLS server name or a Host header without its port), for listener
// isolation: -1 not at all; 0 for a listener without a hostname (any
// host); the wildcard's length for a "*.<suffix>" that covers host (the
// longer, the narrower); above any wildcard for hostname == host. Of a
// port's listeners, the highest rank serves the host. Both are compared
// without case and without a trailing dot.
func HostRank(hostname, host string) int {
	hostname = strings.ToLower(strings.TrimSuffix(hostname, "."))
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	switch suffix, wild := strings.CutPrefix(hostname, "*"); {
	case hostname == "":
		return 0
	case hostname == host:
		return 1 << 16 // above any wildcard's length (at most 253)
	case wild && strings.HasPrefix(suffix, ".") && len(host) > len(suffix) && strings.HasSuffix(host, suffix):
		return len(hostname)
	}
	return -1
}

// ResourceOwner is the one identity that may read a resource, "" for a
// resource readable as its namespace and type allow: an IngressGateway
// carries private keys, so only the gateway's own identity reads it (not
// node proxies, which read everything else).
func ResourceOwner(m proto.Message) string {
	if g, ok := m.(*IngressGateway); ok {
		return g.GetIdentity()
	}
	return ""
}

// RedactedKey stands in for a private key in dumps.
var RedactedKey = []byte("[redacted]")

// Redacted is m as a dump (/debug/config, /config_dump) may show it: an
// IngressGateway's private keys replaced by RedactedKey, in a copy; any
// other message is m itself.
func Redacted(m proto.Message) proto.Message {
	g, ok := m.(*IngressGateway)
	if !ok {
		return m
	}
	c := proto.Clone(g).(*IngressGateway)
	for _, l := range c.GetListeners() {
		for _, kp := range l.GetCertificates() {
			kp.PrivateKey = RedactedKey
		}
	}
	return c
}
