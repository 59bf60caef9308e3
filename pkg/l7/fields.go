package l7

import (
	"net/http"
	"slices"
	"strings"
)

// field is one header field of a request the waypoint sends upstream: a
// canonical name and its values, which are shared (with the caller's
// request, the tunnel, a policy decision) and never changed in place.
type field struct {
	name   string
	values []string
}

// fieldList is an upstream request's header as a list, one entry per
// name, with the operations of http.Header on canonical names. The header
// rules (outgoing, the upgrade path's rewrite, mirrors) run on lists: a
// request has few fields, so a list is cheaper to build than a map, and
// once sorted the inline transport writes it as it is; other transports
// get it as a map (header).
type fieldList []field

func (l fieldList) index(k string) int {
	for i := range l {
		if l[i].name == k {
			return i
		}
	}
	return -1
}

// get returns k's values, nil when k is absent.
func (l fieldList) get(k string) []string {
	if i := l.index(k); i >= 0 {
		return l[i].values
	}
	return nil
}

// first is k's first value, "" when absent (http.Header.Get).
func (l fieldList) first(k string) string {
	if vv := l.get(k); len(vv) > 0 {
		return vv[0]
	}
	return ""
}

func (l fieldList) has(k string) bool { return l.index(k) >= 0 }

func (l *fieldList) set(k string, vv []string) {
	if i := l.index(k); i >= 0 {
		(*l)[i].values = vv
		return
	}
	*l = append(*l, field{k, vv})
}

func (l *fieldList) del(k string) {
	if i := l.index(k); i >= 0 {
		*l = slices.Delete(*l, i, i+1)
	}
}

// deleteFunc deletes the fields whose names f reports.
func (l *fieldList) deleteFunc(f func(name string) bool) {
	*l = slices.DeleteFunc(*l, func(x field) bool { return f(x.name) })
}

// sort orders l by name, the order Request.Write writes a header in.
func (l fieldList) sort() {
	slices.SortFunc(l, func(a, b field) int { return strings.Compare(a.name, b.name) })
}

// header is l as a map (values shared).
func (l fieldList) header() http.Header {
	h := make(http.Header, len(l))
	for _, f := range l {
		h[f.name] = f.values
	}
	return h
}

// fieldsOf is h as a sorted list (values shared).
func fieldsOf(h http.Header) fieldList {
	l := make(fieldList, 0, len(h))
	for k, vv := range h {
		l = append(l, field{k, vv})
	}
	l.sort()
	return l
}
