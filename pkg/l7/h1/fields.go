package h1

import (
	"iter"
	"net/http"
	"slices"
	"strings"
)

// Field is one header Field of a request the waypoint sends upstream: a
// canonical name and its values, which are shared (with the caller's
// request, the tunnel, a policy decision) and never changed in place.
type Field struct {
	Name   string
	Values []string
}

// Fields is an upstream request's header as a list, one entry per
// name, with the operations of http.Header on canonical names. The header
// rules (outgoing, the upgrade path's rewrite, mirrors) run on lists: a
// request has few fields, so a list is cheaper to build than a map, and
// once sorted the inline transport writes it as it is; other transports
// get it as a map (header).
type Fields []Field

func (l Fields) Index(k string) int {
	for i := range l {
		if l[i].Name == k {
			return i
		}
	}
	return -1
}

// Get returns k's values, nil when k is absent.
func (l Fields) Get(k string) []string {
	if i := l.Index(k); i >= 0 {
		return l[i].Values
	}
	return nil
}

// First is k's First value, "" when absent (http.Header.Get).
func (l Fields) First(k string) string {
	if vv := l.Get(k); len(vv) > 0 {
		return vv[0]
	}
	return ""
}

func (l Fields) Has(k string) bool { return l.Index(k) >= 0 }

func (l *Fields) Set(k string, vv []string) {
	if i := l.Index(k); i >= 0 {
		(*l)[i].Values = vv
		return
	}
	*l = append(*l, Field{k, vv})
}

func (l *Fields) Del(k string) {
	if i := l.Index(k); i >= 0 {
		*l = slices.Delete(*l, i, i+1)
	}
}

// DeleteFunc deletes the fields whose names f reports.
func (l *Fields) DeleteFunc(f func(name string) bool) {
	*l = slices.DeleteFunc(*l, func(x Field) bool { return f(x.Name) })
}

// Sort orders l by name, the order Request.Write writes a header in.
func (l Fields) Sort() {
	slices.SortFunc(l, func(a, b Field) int { return strings.Compare(a.Name, b.Name) })
}

// Header is l as a map (values shared).
func (l Fields) Header() http.Header {
	h := make(http.Header, len(l))
	for _, f := range l {
		h[f.Name] = f.Values
	}
	return h
}

// hopByHop are the fields that describe one connection (RFC 9110 section
// 7.6.1), canonical.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// IsHopByHop reports whether the canonical field name k is hop-by-hop.
func IsHopByHop(k string) bool { return slices.Contains(hopByHop, k) }

// RemoveHopByHop deletes from h the hop-by-hop fields and those its
// Connection field names.
func RemoveHopByHop(h http.Header) {
	for k := range ConnectionOptions(h["Connection"]) {
		delete(h, k)
	}
	for _, k := range hopByHop {
		delete(h, k) // canonical already
	}
}

// ConnectionOptions are the canonical names of the fields that the
// Connection field values conn name.
func ConnectionOptions(conn []string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, v := range conn {
			for tok := range strings.SplitSeq(v, ",") {
				if tok = strings.TrimSpace(tok); tok != "" && !yield(http.CanonicalHeaderKey(tok)) {
					return
				}
			}
		}
	}
}

// FieldsOf is h as a sorted list (values shared).
func FieldsOf(h http.Header) Fields {
	l := make(Fields, 0, len(h))
	for k, vv := range h {
		l = append(l, Field{k, vv})
	}
	l.Sort()
	return l
}
