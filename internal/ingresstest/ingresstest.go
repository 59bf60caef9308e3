// Package ingresstest writes the configuration of an ingress Gateway
// (GatewayClass causeway, docs/ingress.md) as YAML documents, as a local
// mesh's configuration directory or a translation test holds it: the
// Gateway and its listeners, its pod, HTTPRoutes attached to it and the
// ReferenceGrants they need. Certificate Secrets are
// backendtlstest.SecretYAML's. For tests and benchmarks only: product
// code never imports it.
//
// Each document ends with a document separator, so that the text goes
// between two others of a mesh's YAML.
package ingresstest

import (
	"fmt"
	"strings"
)

// Listener is one listener of an ingress Gateway.
type Listener struct {
	Name     string
	Port     int
	Protocol string // HTTP or HTTPS
	Hostname string // "": any host
	// Certificates are HTTPS's tls.certificateRefs: Secret names, or
	// "namespace/name" for a Secret of another namespace.
	Certificates []string
	// AllNamespaces admits routes of every namespace (allowedRoutes);
	// else only the Gateway's.
	AllNamespaces bool
}

// GatewayYAML is Gateway ns/name of class causeway with the listeners.
func GatewayYAML(ns, name string, listeners ...Listener) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {namespace: %s, name: %s}\nspec:\n  gatewayClassName: causeway\n  listeners:\n", ns, name)
	for _, l := range listeners {
		fmt.Fprintf(&b, "  - name: %s\n    port: %d\n    protocol: %s\n", l.Name, l.Port, l.Protocol)
		if l.Hostname != "" {
			fmt.Fprintf(&b, "    hostname: %q\n", l.Hostname)
		}
		if len(l.Certificates) > 0 {
			refs := make([]string, len(l.Certificates))
			for i, c := range l.Certificates {
				if cns, cname, ok := strings.Cut(c, "/"); ok {
					refs[i] = fmt.Sprintf("{name: %s, namespace: %s}", cname, cns)
				} else {
					refs[i] = fmt.Sprintf("{name: %s}", c)
				}
			}
			fmt.Fprintf(&b, "    tls: {certificateRefs: [%s]}\n", strings.Join(refs, ", "))
		}
		if l.AllNamespaces {
			b.WriteString("    allowedRoutes: {namespaces: {from: All}}\n")
		}
	}
	b.WriteString("---\n")
	return b.String()
}

// PodYAML is the pod of Gateway ns/gateway in a local mesh: <gateway>-0
// on node, at address ip, running as the ServiceAccount named after the
// Gateway (the gateway's identity).
func PodYAML(ns, gateway, node, ip string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[2]s-0, namespace: %[1]s, labels: {gateway.networking.k8s.io/gateway-name: %[2]s}}
spec: {nodeName: %[3]s, serviceAccountName: %[2]s, containers: [{name: gateway, image: causeway/waypoint}]}
status: {podIP: %[4]s}
---
`, ns, gateway, node, ip)
}

// Parent is a parentRef: Gateway name of namespace Namespace ("": the
// route's), listener Section ("": every listener).
type Parent struct{ Namespace, Name, Section string }

// Backend is a Service port: Service name of namespace Namespace ("": the
// route's).
type Backend struct {
	Namespace, Name string
	Port            int
}

// HTTPRouteYAML is HTTPRoute ns/name attached to parents, for hostnames
// (none: those of its listeners), with one rule sending every request to
// the backends.
func HTTPRouteYAML(ns, name string, parents []Parent, hostnames []string, backends ...Backend) string {
	refs := make([]string, len(parents))
	for i, p := range parents {
		refs[i] = "{name: " + p.Name + optional("namespace", p.Namespace) + optional("sectionName", p.Section) + "}"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {namespace: %s, name: %s}\nspec:\n  parentRefs: [%s]\n", ns, name, strings.Join(refs, ", "))
	if len(hostnames) > 0 {
		fmt.Fprintf(&b, "  hostnames: [%s]\n", quoted(hostnames))
	}
	bes := make([]string, len(backends))
	for i, be := range backends {
		bes[i] = fmt.Sprintf("{name: %s%s, port: %d}", be.Name, optional("namespace", be.Namespace), be.Port)
	}
	fmt.Fprintf(&b, "  rules: [{backendRefs: [%s]}]\n---\n", strings.Join(bes, ", "))
	return b.String()
}

// GrantYAML is ReferenceGrant ns/name letting objects of the kinds (of
// group gateway.networking.k8s.io: HTTPRoute, GRPCRoute, Gateway) in
// namespace from refer to every object of core kind to (Service, Secret)
// in ns.
func GrantYAML(ns, name, from, to string, kinds ...string) string {
	froms := make([]string, len(kinds))
	for i, k := range kinds {
		froms[i] = fmt.Sprintf("{group: gateway.networking.k8s.io, kind: %s, namespace: %s}", k, from)
	}
	return fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {namespace: %s, name: %s}
spec:
  from: [%s]
  to: [{group: "", kind: %s}]
---
`, ns, name, strings.Join(froms, ", "), to)
}

func optional(field, value string) string {
	if value == "" {
		return ""
	}
	return ", " + field + ": " + value
}

func quoted(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// IngressClassYAML is IngressClass name of Causeway's ingress controller,
// marked the cluster's default when isDefault, with spec.parameters
// (a YAML flow mapping, "": none) naming the Gateway that serves its
// Ingresses.
func IngressClassYAML(name string, isDefault bool, parameters string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: %s\n", name)
	if isDefault {
		b.WriteString("  annotations: {ingressclass.kubernetes.io/is-default-class: \"true\"}\n")
	}
	b.WriteString("spec:\n  controller: causeway.dev/ingress-controller\n")
	if parameters != "" {
		fmt.Fprintf(&b, "  parameters: %s\n", parameters)
	}
	b.WriteString("---\n")
	return b.String()
}
