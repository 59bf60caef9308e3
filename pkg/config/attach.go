package config

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Attachment is one listener a route's parentRef attaches to, with the
// hostnames the route serves there: the intersection of the listener's
// hostname and the route's (empty: any host).
type Attachment struct {
	Listener  gwv1.SectionName
	Hostnames []string
}

// Attach resolves a route's parentRef naming the ingress Gateway gw (whose
// listeners resolved to reports) for a route of kind in routeNS, whose
// namespace has nsLabels, with the route's hostnames. It returns the
// listeners the route attaches to, or none and the Gateway API reason for
// the parent's Accepted condition: NoMatchingParent (no attachable
// listener of that sectionName or port, ListenerReport.Attachable), NotAllowedByListeners (their
// allowedRoutes refuse the route's kind or namespace), or
// NoMatchingListenerHostname (no hostname in common).
func Attach(gw *gwv1.Gateway, reports []ListenerReport, ref gwv1.ParentReference, kind, routeNS string,
	nsLabels map[string]string, hostnames []gwv1.Hostname) ([]Attachment, gwv1.RouteConditionReason, string) {
	var out []Attachment
	candidates, allowed := 0, 0
	for i, l := range gw.Spec.Listeners {
		r := reports[i]
		if ref.SectionName != nil && *ref.SectionName != l.Name || ref.Port != nil && *ref.Port != l.Port || !r.Attachable() {
			continue
		}
		candidates++
		if !supportsKind(r.SupportedKinds, kind) || !listenerAdmits(gw.Namespace, l, routeNS, nsLabels) {
			continue
		}
		allowed++
		if hosts, ok := intersectHostnames(l.Hostname, hostnames); ok {
			out = append(out, Attachment{Listener: l.Name, Hostnames: hosts})
		}
	}
	switch {
	case len(out) > 0:
		return out, gwv1.RouteReasonAccepted, ""
	case candidates == 0:
		return nil, gwv1.RouteReasonNoMatchingParent, fmt.Sprintf("Gateway %s/%s has no attachable listener%s", gw.Namespace, gw.Name, refSelector(ref))
	case allowed == 0:
		return nil, gwv1.RouteReasonNotAllowedByListeners, fmt.Sprintf("the allowedRoutes of Gateway %s/%s's listeners%s do not admit %s from namespace %s",
			gw.Namespace, gw.Name, refSelector(ref), kind, routeNS)
	}
	return nil, gwv1.RouteReasonNoMatchingListenerHostname, fmt.Sprintf("no hostname of the route matches Gateway %s/%s's listeners%s",
		gw.Namespace, gw.Name, refSelector(ref))
}

func refSelector(ref gwv1.ParentReference) string {
	var s []string
	if ref.SectionName != nil {
		s = append(s, "sectionName "+string(*ref.SectionName))
	}
	if ref.Port != nil {
		s = append(s, fmt.Sprintf("port %d", *ref.Port))
	}
	if len(s) == 0 {
		return ""
	}
	return " (" + strings.Join(s, ", ") + ")"
}

func supportsKind(kinds []gwv1.RouteGroupKind, kind string) bool {
	for _, k := range kinds {
		if string(k.Kind) == kind {
			return true
		}
	}
	return false
}

// intersectHostnames is what a listener's hostname and a route's
// hostnames have in common (Gateway API: a wildcard label "*." stands for
// one or more labels): the route's hostnames that fall within the
// listener's, and the listener's hostname where a route wildcard covers
// it. Empty with ok: any host (neither restricts it); not ok: nothing in
// common.
func intersectHostnames(listener *gwv1.Hostname, route []gwv1.Hostname) (hosts []string, ok bool) {
	if listener == nil || *listener == "" {
		if len(route) == 0 {
			return nil, true
		}
		for _, h := range route {
			hosts = append(hosts, string(h))
		}
		return hosts, true
	}
	l := string(*listener)
	if len(route) == 0 {
		return []string{l}, true
	}
	for _, h := range route {
		r := string(h)
		switch {
		case hostWithin(r, l):
			hosts = append(hosts, r)
		case hostWithin(l, r):
			hosts = append(hosts, l)
		}
	}
	return hosts, len(hosts) > 0
}

// hostWithin: every host name matches also matches pattern.
func hostWithin(name, pattern string) bool {
	if name == pattern {
		return true
	}
	suffix, wild := strings.CutPrefix(pattern, "*")
	return wild && strings.HasSuffix(name, suffix) && len(strings.TrimSuffix(strings.TrimPrefix(name, "*"), suffix)) > 0
}

// listenerAdmits: listener l's allowedRoutes.namespaces admits routes of
// namespace ns (labels nsLabels): from Same (the default) the Gateway's
// own, All any, a Selector those it matches.
func listenerAdmits(gwNS string, l gwv1.Listener, ns string, nsLabels map[string]string) bool {
	from := gwv1.NamespacesFromSame
	if l.AllowedRoutes != nil && l.AllowedRoutes.Namespaces != nil && l.AllowedRoutes.Namespaces.From != nil {
		from = *l.AllowedRoutes.Namespaces.From
	}
	switch from {
	case gwv1.NamespacesFromAll:
		return true
	case gwv1.NamespacesFromSelector:
		sel, err := metav1.LabelSelectorAsSelector(l.AllowedRoutes.Namespaces.Selector)
		return err == nil && l.AllowedRoutes.Namespaces.Selector != nil && sel.Matches(labels.Set(nsLabels))
	case gwv1.NamespacesFromSame:
		return ns == gwNS
	}
	return false
}

// ListenerFor is the index of the listener of gw on port that serves
// requests for host (a TLS server name or a Host header without its port),
// as listener isolation has it (meshv1.HostRank): the serving listener
// whose hostname is host itself, else the one whose wildcard covers it
// most narrowly, else one without a hostname; false when none does.
func ListenerFor(gw *gwv1.Gateway, reports []ListenerReport, port gwv1.PortNumber, host string) (int, bool) {
	best, bestRank := -1, -1
	for i, l := range gw.Spec.Listeners {
		if l.Port != port || !reports[i].Serves() {
			continue
		}
		if rank := meshv1.HostRank(string(hostnameOf(l)), host); rank > bestRank {
			best, bestRank = i, rank
		}
	}
	return best, best >= 0
}
