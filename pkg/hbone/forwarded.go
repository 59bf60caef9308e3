package hbone

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// maxForwardedLen bounds the Forwarded value the parser will look at. The
// server's header limit bounds it too; this keeps the parser's cost fixed.
const maxForwardedLen = 4096

var errNoForwardedFor = errors.New("forwarded: no for= address")

// ParseForwardedFor returns the address in the for= parameter of the first
// element of a Forwarded header (RFC 7239), the one nearest the original
// client. The node must be an IPv4 address or a bracketed IPv6 address, with
// an optional port (0 when absent); "unknown" and obfuscated identifiers are
// errors. The result is untrusted metadata: it names whoever the sender
// claims, and never identifies anyone.
func ParseForwardedFor(v string) (netip.AddrPort, error) {
	if len(v) > maxForwardedLen {
		return netip.AddrPort{}, fmt.Errorf("forwarded: value too long (%d bytes)", len(v))
	}
	p := forwardedParser{s: v}
	var (
		node  string
		found bool
	)
	for {
		p.skipOWS()
		if p.done() || p.peek() == ',' {
			break
		}
		if p.peek() == ';' {
			p.i++
			continue
		}
		name, err := p.token()
		if err != nil {
			return netip.AddrPort{}, err
		}
		if p.done() || p.peek() != '=' {
			return netip.AddrPort{}, fmt.Errorf("forwarded: parameter %q without value", name)
		}
		p.i++
		val, err := p.value()
		if err != nil {
			return netip.AddrPort{}, err
		}
		if strings.EqualFold(name, "for") {
			if found {
				return netip.AddrPort{}, errors.New("forwarded: repeated for= in one element")
			}
			node, found = val, true
		}
		p.skipOWS()
		if !p.done() && p.peek() != ';' && p.peek() != ',' {
			return netip.AddrPort{}, fmt.Errorf("forwarded: unexpected %q after parameter %q", p.peek(), name)
		}
	}
	if !found {
		return netip.AddrPort{}, errNoForwardedFor
	}
	return parseForwardedNode(node)
}

// FormatForwardedFor formats ap as a Forwarded header value: for="ip:port",
// IPv6 in brackets; the port is left out when it is 0.
func FormatForwardedFor(ap netip.AddrPort) string {
	addr := ap.Addr().Unmap()
	if ap.Port() == 0 {
		if addr.Is6() {
			return `for="[` + addr.String() + `]"`
		}
		return `for="` + addr.String() + `"`
	}
	return `for="` + netip.AddrPortFrom(addr, ap.Port()).String() + `"`
}

func parseForwardedNode(node string) (netip.AddrPort, error) {
	host, portStr := node, ""
	if strings.HasPrefix(node, "[") {
		end := strings.IndexByte(node, ']')
		if end < 0 {
			return netip.AddrPort{}, fmt.Errorf("forwarded: for=%q: unterminated IPv6 bracket", node)
		}
		host = node[:end+1]
		rest := node[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return netip.AddrPort{}, fmt.Errorf("forwarded: for=%q: junk after IPv6 address", node)
			}
			portStr = rest[1:]
			if portStr == "" {
				return netip.AddrPort{}, fmt.Errorf("forwarded: for=%q: empty port", node)
			}
		}
	} else if i := strings.IndexByte(node, ':'); i >= 0 {
		host, portStr = node[:i], node[i+1:]
		if portStr == "" {
			return netip.AddrPort{}, fmt.Errorf("forwarded: for=%q: empty port", node)
		}
	}
	addr, err := parseAuthorityIP(host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("forwarded: for=%q: %w", node, err)
	}
	var port uint16
	if portStr != "" {
		if port, err = parsePort(portStr); err != nil {
			return netip.AddrPort{}, fmt.Errorf("forwarded: for=%q: %w", node, err)
		}
	}
	return netip.AddrPortFrom(addr, port), nil
}

type forwardedParser struct {
	s string
	i int
}

func (p *forwardedParser) done() bool { return p.i >= len(p.s) }
func (p *forwardedParser) peek() byte { return p.s[p.i] }

func (p *forwardedParser) skipOWS() {
	for !p.done() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

func (p *forwardedParser) token() (string, error) {
	start := p.i
	for !p.done() && isTokenChar(p.peek()) {
		p.i++
	}
	if p.i == start {
		if p.done() {
			return "", errors.New("forwarded: expected token, got end of value")
		}
		return "", fmt.Errorf("forwarded: expected token at %q", p.s[p.i:])
	}
	return p.s[start:p.i], nil
}

func (p *forwardedParser) value() (string, error) {
	if p.done() {
		return "", errors.New("forwarded: missing value")
	}
	if p.peek() != '"' {
		return p.token()
	}
	p.i++
	var b strings.Builder
	for !p.done() {
		c := p.peek()
		switch {
		case c == '"':
			p.i++
			return b.String(), nil
		case c == '\\':
			p.i++
			if p.done() {
				return "", errors.New("forwarded: unterminated escape in quoted string")
			}
			c = p.peek()
			if !isQuotedPairChar(c) {
				return "", fmt.Errorf("forwarded: invalid escaped byte %#x", c)
			}
			b.WriteByte(c)
			p.i++
		case isQDText(c):
			b.WriteByte(c)
			p.i++
		default:
			return "", fmt.Errorf("forwarded: invalid byte %#x in quoted string", c)
		}
	}
	return "", errors.New("forwarded: unterminated quoted string")
}

// isTokenChar reports whether c is an RFC 9110 tchar.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func isQDText(c byte) bool {
	return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5b) || (c >= 0x5d && c <= 0x7e) || c >= 0x80
}

func isQuotedPairChar(c byte) bool {
	return c == '\t' || c == ' ' || (c >= 0x21 && c <= 0x7e) || c >= 0x80
}
