package hbone

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// maxAuthorityLen bounds what the parsers look at; a DNS name with a port fits.
const maxAuthorityLen = 255 + len(":65535")

// ParseAuthority parses an HBONE :authority strictly as ip:port: dotted-quad
// IPv4 or bracketed IPv6 (no zone, no IPv4-mapped IPv6, which would let one
// destination hide behind two spellings) and a decimal port 1-65535 without
// sign or leading zeros.
func ParseAuthority(s string) (netip.AddrPort, error) {
	if len(s) > maxAuthorityLen {
		return netip.AddrPort{}, fmt.Errorf("authority too long (%d bytes)", len(s))
	}
	host, port, err := splitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("authority %q: %w", s, err)
	}
	addr, err := parseAuthorityIP(host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("authority %q: %w", s, err)
	}
	return netip.AddrPortFrom(addr, port), nil
}

// splitHostPort splits host:port where an IPv6 host is bracketed; the host
// keeps its brackets so that the caller knows what it was given.
func splitHostPort(s string) (string, uint16, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", 0, errors.New("missing port")
	}
	host, portStr := s[:i], s[i+1:]
	port, err := parsePort(portStr)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		return "", 0, errors.New("missing host")
	}
	return host, port, nil
}

func parsePort(s string) (uint16, error) {
	if s == "" {
		return 0, errors.New("missing port")
	}
	if len(s) > 5 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("invalid port %q", s)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("invalid port %q", s)
		}
		n = n*10 + int(c-'0')
	}
	if n == 0 || n > 65535 {
		return 0, fmt.Errorf("port %q out of range 1-65535", s)
	}
	return uint16(n), nil
}

// parseAuthorityIP parses the host part of an authority: a dotted-quad IPv4
// address, or an IPv6 address in brackets.
func parseAuthorityIP(host string) (netip.Addr, error) {
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") {
			return netip.Addr{}, errors.New("unterminated IPv6 bracket")
		}
		inner := host[1 : len(host)-1]
		addr, err := netip.ParseAddr(inner)
		if err != nil || !addr.Is6() {
			return netip.Addr{}, fmt.Errorf("invalid IPv6 address %q", inner)
		}
		if addr.Zone() != "" {
			return netip.Addr{}, fmt.Errorf("IPv6 address %q has a zone", inner)
		}
		if addr.Is4In6() {
			return netip.Addr{}, fmt.Errorf("IPv4-mapped IPv6 address %q: use the IPv4 form", inner)
		}
		return addr, nil
	}
	addr, err := netip.ParseAddr(host)
	if err != nil || !addr.Is4() {
		return netip.Addr{}, fmt.Errorf("invalid IPv4 address %q (IPv6 needs brackets)", host)
	}
	return addr, nil
}

// FormatAuthority formats ap as an :authority (IPv6 in brackets), the inverse
// of ParseAuthority. IPv4-mapped IPv6 addresses are written as IPv4.
func FormatAuthority(ap netip.AddrPort) string {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
}

// parseHostAuthority accepts a DNS name with a port (name:port), for servers
// that opt in to hostname authorities. Labels are letters, digits, hyphens
// and underscores (service names in the wild use them), 1-63 bytes each, not
// starting or ending with a hyphen; the name is at most 253 bytes.
func parseHostAuthority(s string) (string, error) {
	if len(s) > maxAuthorityLen {
		return "", fmt.Errorf("authority too long (%d bytes)", len(s))
	}
	host, _, err := splitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("authority %q: %w", s, err)
	}
	name := strings.TrimSuffix(host, ".")
	if len(name) == 0 || len(name) > 253 {
		return "", fmt.Errorf("authority %q: invalid host name length", s)
	}
	allDigits := true
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return "", fmt.Errorf("authority %q: invalid host name label %q", s, label)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return "", fmt.Errorf("authority %q: host name label %q starts or ends with '-'", s, label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-', c == '_':
				allDigits = false
			default:
				return "", fmt.Errorf("authority %q: invalid character %q in host name", s, c)
			}
		}
	}
	if allDigits {
		// Something like 10.1.2.300: a broken address, not a name.
		return "", fmt.Errorf("authority %q: numeric host is not a valid IP address", s)
	}
	return s, nil
}
