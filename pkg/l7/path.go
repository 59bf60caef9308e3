package l7

import (
	"errors"
	"net/url"
	"strings"
)

var errBadPath = errors.New("path must start with /")

// normalizePath returns the RFC 3986 (section 6.2.2) normal form of an
// escaped request path: percent-encoded unreserved characters are decoded,
// other escapes get upper-case hex, and dot segments are removed.
//
// Routing, authorization and the upstream all see this one form, so a path
// like "/public/%2e%2e/admin" cannot be routed or authorized as something
// other than what the backend will serve ("/admin"). Escaped slashes (%2F)
// stay escaped: they are data, not separators.
func normalizePath(p string) (string, error) {
	e, err := normalizeEscapes(p)
	if err != nil {
		return "", err
	}
	return removeDotSegments(e), nil
}

// normalizeEscapes decodes percent-encoded unreserved characters and upper-
// cases the hex digits of the other escapes.
func normalizeEscapes(p string) (string, error) {
	if p == "" || p[0] != '/' {
		return "", errBadPath
	}
	var b strings.Builder
	changed := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c != '%' {
			if changed {
				b.WriteByte(c)
			}
			continue
		}
		if i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
			return "", errors.New("invalid percent-encoding in path")
		}
		v := unhex(p[i+1])<<4 | unhex(p[i+2])
		hi, lo := upperHex(p[i+1]), upperHex(p[i+2])
		decode := isUnreserved(v)
		if !changed && (decode || hi != p[i+1] || lo != p[i+2]) {
			b.Grow(len(p))
			b.WriteString(p[:i])
			changed = true
		}
		if changed {
			if decode {
				b.WriteByte(v)
			} else {
				b.WriteByte('%')
				b.WriteByte(hi)
				b.WriteByte(lo)
			}
		}
		i += 2
	}
	if changed {
		return b.String(), nil
	}
	return p, nil
}

// removeDotSegments implements RFC 3986 section 5.2.4 for an absolute path.
func removeDotSegments(p string) string {
	if !strings.Contains(p, "/.") {
		return p
	}
	segs := strings.Split(p, "/") // p starts with "/": segs[0] == ""
	out := make([]string, 1, len(segs))
	for i := 1; i < len(segs); i++ {
		last := i == len(segs)-1
		switch segs[i] {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 1 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, segs[i])
		}
	}
	if len(out) == 1 {
		return "/"
	}
	return strings.Join(out, "/")
}

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

func upperHex(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}

// trimPrefixValue is a PathPrefix value with its trailing slashes removed:
// the spec ignores a trailing "/", and "/" itself becomes "" (matches all).
func trimPrefixValue(v string) string { return strings.TrimRight(v, "/") }

// hasSegmentPrefix reports whether path p starts with prefix (already
// trimmed) on a path-element boundary: "/foo" matches "/foo", "/foo/" and
// "/foo/bar", never "/foobar".
func hasSegmentPrefix(p, prefix string) bool {
	if !strings.HasPrefix(p, prefix) {
		return false
	}
	return len(p) == len(prefix) || p[len(prefix)] == '/'
}

// replacePrefix applies ReplacePrefixMatch: the matched prefix (element by
// element, trailing "/" ignored) of p becomes repl. It reproduces the table in
// the Gateway API HTTPPathModifier documentation, e.g. "/foo/bar" with prefix
// "/foo" and replacement "/xyz/" gives "/xyz/bar", "/foo" with replacement ""
// gives "/". A path that does not carry the prefix is returned unchanged.
func replacePrefix(p, prefix, repl string) string {
	m := trimPrefixValue(prefix)
	if !hasSegmentPrefix(p, m) {
		return p
	}
	out := trimPrefixValue(repl) + p[len(m):]
	if out == "" || out[0] != '/' {
		out = "/" + out
	}
	return out
}

// setEscapedPath points u at the escaped path esc, keeping the query.
func setEscapedPath(u *url.URL, esc string) error {
	p, err := url.PathUnescape(esc)
	if err != nil {
		return err
	}
	u.Path = p
	u.RawPath = esc
	return nil
}
