package config

import (
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Translate turns a complete set of objects into a Snapshot. An object the
// mesh cannot serve as written is refused on its own and fails closed
// (docs/design.md §6): a Pod gets no workload (no endpoint, no identity), a
// Service is served with invalid_reason so that its traffic is refused, a
// Gateway is no waypoint (what binds to it fails closed), a Namespace's
// broken use-waypoint label refuses the traffic of what inherits it, a
// route is not programmed, an EndpointSlice's bad endpoint is skipped;
// Snapshot.Rejected lists every refusal with its reason, and everything
// else is translated as if the refused objects were fixed. Only a set of
// objects that is not a configuration at all (an object of an unsupported
// type, without a name, or defined twice) returns an *InvalidError and no
// snapshot, so the caller keeps its last one.
func Translate(objs []Object, opts Options) (*Snapshot, error) {
	t := newTranslator(opts)
	t.run(objs)
	if err := t.fatal.err(); err != nil {
		return nil, err
	}
	t.out.Rejected = t.ps.list
	return t.out, nil
}

func newTranslator(opts Options) *translator {
	return &translator{
		opts:           opts.withDefaults(),
		namespaces:     map[string]*namespaceInfo{},
		pods:           map[nsName]*podInfo{},
		podsByNS:       map[string][]nsName{},
		services:       map[nsName]*serviceInfo{},
		slices:         map[nsName][]*sliceInfo{},
		nodes:          map[string]*meshv1.Locality{},
		gateways:       map[nsName]*gatewayInfo{},
		grants:         map[string][]*gwv1.ReferenceGrant{},
		configMaps:     map[nsName]*corev1.ConfigMap{},
		secrets:        map[nsName]*corev1.Secret{},
		ingressClasses: map[string]*ingressClassInfo{},
		seen:           map[string]string{},
		reasons:        map[string][]string{},
		out:            newSnapshot(),
	}
}

// run orders the passes so that every refusal is decided before anything
// that depends on it is built: pods and services are checked (addresses,
// identities, waypoint labels) before services select their endpoints and
// pods become workloads.
func (t *translator) run(objs []Object) {
	t.collect(objs)
	t.translateWaypoints()
	t.reserveIngressIdentities()
	t.preparePods()
	t.prepareServices()
	t.checkAddresses()
	t.resolveWaypointPods()
	t.checkPodIdentities()
	t.checkWaypointLabels()
	t.translateServices()
	t.translateBackendTLSPolicies()
	t.translateWorkloads()
	t.translateRoutes()
	t.resolveIngressClasses()
	t.translateIngress()
	t.translateConnectionPolicies()
	t.checkOutput()
}

type nsName struct{ ns, name string }

func (n nsName) String() string { return n.ns + "/" + n.name }

type namespaceInfo struct {
	origin string
	ns     *corev1.Namespace // nil when the namespace is only implied by its objects
}

func (n *namespaceInfo) labels() map[string]string {
	if n == nil || n.ns == nil {
		return nil
	}
	return n.ns.Labels
}

type podInfo struct {
	origin   string
	obj      string // "Pod ns/name"
	pod      *corev1.Pod
	uid      string
	ips      []string // canonical
	appAddr  string   // canonical, from causeway.dev/app-address
	active   bool     // not Succeeded/Failed
	ready    bool
	waypoint *gatewayInfo // set on a waypoint's own pods
	ingress  *gatewayInfo // set on an ingress Gateway's own pods
	serving  map[uint32]struct{}
}

type serviceInfo struct {
	origin string
	svc    *corev1.Service
	vips   []string        // canonical
	out    *meshv1.Service // nil for ExternalName services
}

type sliceInfo struct {
	origin string
	slice  *discoveryv1.EndpointSlice
}

type gatewayInfo struct {
	origin string
	gw     *gwv1.Gateway
	out    *meshv1.Waypoint // nil unless the gateway is a valid waypoint
}

type routeInfo[T any] struct {
	origin string
	route  T
}

type connPolicyInfo struct {
	origin string
	policy *ConnectionPolicy
}

type translator struct {
	opts       Options
	fatal      problems            // the objects are not a configuration: no snapshot
	ps         problems            // per-object refusals: Snapshot.Rejected
	reasons    map[string][]string // refused object ("Kind ns/name") -> why
	namespaces map[string]*namespaceInfo
	pods       map[nsName]*podInfo
	podOrder   []nsName
	podsByNS   map[string][]nsName // podOrder by namespace: services and waypoints select in theirs
	services   map[nsName]*serviceInfo
	svcOrder   []nsName
	slices     map[nsName][]*sliceInfo // by the Service they belong to
	nodes      map[string]*meshv1.Locality
	gateways   map[nsName]*gatewayInfo
	gwOrder    []nsName
	httpRoutes []routeInfo[*gwv1.HTTPRoute]
	grpcRoutes []routeInfo[*gwv1.GRPCRoute]
	ingresses  []routeInfo[*networkingv1.Ingress]
	// ingressClasses: those of ours, by name; defaultIngressClasses: every
	// IngressClass (ours or not) marked the cluster's default.
	ingressClasses        map[string]*ingressClassInfo
	defaultIngressClasses []string
	grants                map[string][]*gwv1.ReferenceGrant // by namespace
	connPolicies          []connPolicyInfo
	tlsPolicies           []*tlsPolicyInfo
	configMaps            map[nsName]*corev1.ConfigMap // read for BackendTLSPolicies' CA certificates
	secrets               map[nsName]*corev1.Secret    // read for ingress listeners' certificates
	seen                  map[string]string            // "Kind ns/name" -> origin
	out                   *Snapshot
	reports               *Reports // nil unless Analyze asked for them
}

// problem refuses object; the pass that raises it makes the object fail
// closed, and later passes ask refused.
func (t *translator) problem(origin, object, format string, args ...any) {
	t.ps.add(origin, object, format, args...)
	msg := fmt.Sprintf(format, args...)
	t.reasons[object] = append(t.reasons[object], msg)
	t.report(object, msg)
}

// fatalProblem: the set of objects is not a configuration; Translate
// returns no snapshot.
func (t *translator) fatalProblem(origin, object, format string, args ...any) {
	t.fatal.add(origin, object, format, args...)
	t.report(object, fmt.Sprintf(format, args...))
}

// refused reports whether object ("Kind ns/name") has been refused.
func (t *translator) refused(object string) bool { return len(t.reasons[object]) > 0 }

func (t *translator) report(object, msg string) {
	if t.reports == nil {
		return
	}
	if t.reports.Problems != nil {
		t.reports.Problems[object] = append(t.reports.Problems[object], msg)
	}
	if r := t.reports.route(object); r != nil {
		r.Problems = append(r.Problems, msg)
	}
}

// collect indexes the objects, defaulting namespaces and refusing duplicates.
func (t *translator) collect(objs []Object) {
	for _, o := range objs {
		var namespaced bool
		switch o.Obj.(type) {
		case *corev1.Namespace, *gwv1.GatewayClass, *corev1.Node, *networkingv1.IngressClass:
		case *networkingv1.Ingress, *corev1.Pod, *corev1.Service, *corev1.ServiceAccount, *discoveryv1.EndpointSlice,
			*gwv1.Gateway, *gwv1.HTTPRoute, *gwv1.GRPCRoute, *gwv1.ReferenceGrant, *ConnectionPolicy,
			*gwv1.BackendTLSPolicy, *corev1.ConfigMap, *corev1.Secret:
			namespaced = true
		default:
			t.fatalProblem(o.Origin, "", "unsupported object %T", o.Obj)
			continue
		}
		// Every kind accepted is a Go type of the kind's name.
		kind := reflect.TypeOf(o.Obj).Elem().Name()
		meta := o.Obj.(metav1.Object)
		var ns string
		if namespaced {
			if meta.GetNamespace() == "" {
				meta.SetNamespace(corev1.NamespaceDefault)
			}
			ns = meta.GetNamespace()
		}
		name := meta.GetName()
		key := kind + " " + name
		if ns != "" {
			key = kind + " " + ns + "/" + name
		}
		if name == "" {
			t.fatalProblem(o.Origin, kind, "metadata.name is required")
			continue
		}
		if prev, dup := t.seen[key]; dup {
			t.fatalProblem(o.Origin, key, "defined twice (also in %s)", prev)
			continue
		}
		t.seen[key] = o.Origin
		if ns != "" {
			if _, ok := t.namespaces[ns]; !ok {
				t.namespaces[ns] = &namespaceInfo{}
			}
		}
		id := nsName{ns, name}
		switch v := o.Obj.(type) {
		case *corev1.Namespace:
			t.namespaces[name] = &namespaceInfo{origin: o.Origin, ns: v}
		case *corev1.Node:
			if l := nodeLocality(v); l != nil {
				t.nodes[name] = l
			}
		case *corev1.Pod:
			t.pods[id] = &podInfo{origin: o.Origin, obj: key, pod: v}
			t.podOrder = append(t.podOrder, id)
			t.podsByNS[ns] = append(t.podsByNS[ns], id)
		case *corev1.Service:
			t.services[id] = &serviceInfo{origin: o.Origin, svc: v}
			t.svcOrder = append(t.svcOrder, id)
		case *discoveryv1.EndpointSlice:
			svc := v.Labels[LabelServiceName]
			if svc == "" {
				t.fatalProblem(o.Origin, key, "label %s naming its Service is required", LabelServiceName)
				continue
			}
			sk := nsName{ns, svc}
			t.slices[sk] = append(t.slices[sk], &sliceInfo{origin: o.Origin, slice: v})
		case *gwv1.Gateway:
			t.gateways[id] = &gatewayInfo{origin: o.Origin, gw: v}
			t.gwOrder = append(t.gwOrder, id)
		case *gwv1.HTTPRoute:
			t.httpRoutes = append(t.httpRoutes, routeInfo[*gwv1.HTTPRoute]{o.Origin, v})
		case *gwv1.GRPCRoute:
			t.grpcRoutes = append(t.grpcRoutes, routeInfo[*gwv1.GRPCRoute]{o.Origin, v})
		case *gwv1.ReferenceGrant:
			t.grants[ns] = append(t.grants[ns], v)
		case *ConnectionPolicy:
			t.connPolicies = append(t.connPolicies, connPolicyInfo{o.Origin, v})
		case *gwv1.BackendTLSPolicy:
			t.tlsPolicies = append(t.tlsPolicies, &tlsPolicyInfo{origin: o.Origin, obj: key, policy: v})
		case *corev1.ConfigMap:
			t.configMaps[id] = v
		case *corev1.Secret:
			t.secrets[id] = v
		case *networkingv1.Ingress:
			t.ingresses = append(t.ingresses, routeInfo[*networkingv1.Ingress]{o.Origin, v})
		case *networkingv1.IngressClass:
			if v.Annotations[networkingv1.AnnotationIsDefaultIngressClass] == "true" {
				t.defaultIngressClasses = append(t.defaultIngressClasses, name)
			}
			if v.Spec.Controller == IngressClassController {
				t.ingressClasses[name] = &ingressClassInfo{origin: o.Origin, class: v}
			}
		}
	}
	// A slice of a Service that does not exist is refused (unused).
	keys := make([]nsName, 0, len(t.slices))
	for sk := range t.slices {
		keys = append(keys, sk)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, sk := range keys {
		if _, ok := t.services[sk]; !ok {
			for _, s := range t.slices[sk] {
				t.problem(s.origin, "EndpointSlice "+sk.ns+"/"+s.slice.Name,
					"dangling reference: Service %s does not exist", sk)
			}
		}
	}
}

func defaultNS(ns *string) string {
	if *ns == "" {
		*ns = corev1.NamespaceDefault
	}
	return *ns
}

// translateWaypoints builds a Waypoint for every Gateway of the waypoint class.
func (t *translator) translateWaypoints() {
	for _, id := range t.gwOrder {
		g := t.gateways[id]
		if string(g.gw.Spec.GatewayClassName) != WaypointClass {
			continue
		}
		obj := "Gateway " + id.String()
		var port uint32
		for _, l := range g.gw.Spec.Listeners {
			if string(l.Protocol) == WaypointProtocol {
				port = uint32(l.Port)
				break
			}
		}
		if port == 0 {
			t.problem(g.origin, obj, "a %s Gateway needs a listener with protocol %s (port 15008)", WaypointClass, WaypointProtocol)
			continue
		}
		waypointFor := meshv1.WaypointForService
		if v, ok := g.gw.Labels[LabelWaypointFor]; ok {
			switch v {
			case meshv1.WaypointForService, meshv1.WaypointForWorkload, meshv1.WaypointForAll:
				waypointFor = v
			default:
				t.problem(g.origin, obj, "label %s=%q: want service, workload or all", LabelWaypointFor, v)
				continue
			}
		}
		g.out = &meshv1.Waypoint{
			Name:        id.name,
			Namespace:   id.ns,
			HbonePort:   port,
			WaypointFor: waypointFor,
			// Its own Service (the deployer's), the way to state how node
			// proxies choose among its pods.
			TrafficDistribution: trafficDistribution(t.services[id]),
		}
	}
}

// checkWaypointLabels refuses every object whose use-waypoint label names
// no usable waypoint, whether or not anything inherits it: a Namespace (its
// Services and pods that inherit the label fail closed), a Service (served
// refusing traffic), a Pod (no workload).
func (t *translator) checkWaypointLabels() {
	check := func(origin, obj, ns string, l map[string]string) {
		ref, set := useWaypoint(l, ns)
		if !set || ref == nil {
			return
		}
		if why := t.bindingProblem(ref, ns); why != "" {
			t.problem(origin, obj, "%s=%s: %s", LabelUseWaypoint, ref.name, why)
		}
	}
	names := make([]string, 0, len(t.namespaces))
	for n := range t.namespaces {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if ni := t.namespaces[n]; ni.ns != nil {
			check(ni.origin, "Namespace "+n, n, ni.ns.Labels)
		}
	}
	for _, id := range t.svcOrder {
		s := t.services[id]
		check(s.origin, "Service "+id.String(), id.ns, s.svc.Labels)
	}
	for _, id := range t.podOrder {
		p := t.pods[id]
		if p.waypoint == nil { // a waypoint's own pods are never bound
			check(p.origin, p.obj, id.ns, p.pod.Labels)
		}
	}
}

// useWaypoint reads the use-waypoint labels of one object: set reports
// whether the object decides at all; ref is nil when it opts out ("none").
func useWaypoint(l map[string]string, ns string) (ref *nsName, set bool) {
	v := l[LabelUseWaypoint]
	if v == "" {
		return nil, false
	}
	if v == UseWaypointNone {
		return nil, true
	}
	if wns := l[LabelUseWaypointNamespace]; wns != "" {
		ns = wns
	}
	return &nsName{ns, v}, true
}

// bindWaypoint applies docs/design.md §6: the most specific object that carries
// use-waypoint decides (objLabels before the namespace's), "none" opts out,
// and the binding holds only if the waypoint serves that kind of traffic
// (want: service or workload). A binding that names no usable waypoint
// returns why instead: the caller refuses the traffic, since sending it
// direct would skip the waypoint.
func (t *translator) bindWaypoint(objLabels map[string]string, ns, want string) (ref *meshv1.Ref, why string) {
	r, g := t.resolveWaypoint(objLabels, ns)
	if r == nil {
		return nil, ""
	}
	if why := t.bindingProblem(r, ns); why != "" {
		return nil, why
	}
	if f := g.out.WaypointFor; f != want && f != meshv1.WaypointForAll {
		return nil, ""
	}
	return &meshv1.Ref{Namespace: r.ns, Name: r.name}, ""
}

// bindingProblem says why namespace ns cannot be bound to waypoint ref, or
// returns "".
func (t *translator) bindingProblem(ref *nsName, ns string) string {
	g := t.gateways[*ref]
	switch {
	case g == nil:
		return fmt.Sprintf("waypoint %s does not exist: no Gateway of class %s named %s in namespace %s", ref, WaypointClass, ref.name, ref.ns)
	case g.out == nil:
		return fmt.Sprintf("Gateway %s is not a usable waypoint (not of class %s, or refused)", ref, WaypointClass)
	case !WaypointAdmits(g.gw, ns, t.namespaces[ns].labels()):
		return notAdmitted(ref, ns)
	}
	return ""
}

// resolveWaypoint finds the waypoint an object's labels (or else its
// namespace's) name: ref is nil when nothing is named, g nil when the named
// Gateway does not exist.
func (t *translator) resolveWaypoint(objLabels map[string]string, ns string) (ref *nsName, g *gatewayInfo) {
	ref, set := useWaypoint(objLabels, ns)
	if !set {
		ref, _ = useWaypoint(t.namespaces[ns].labels(), ns)
	}
	if ref == nil {
		return nil, nil
	}
	return ref, t.gateways[*ref]
}

// WaypointAdmits reports whether a waypoint takes the traffic of namespace
// ns (with labels nsLabels): its own namespace's always, another's only as
// its HBONE listener's allowedRoutes.namespaces says (from All, or a
// Selector matching the namespace), as Istio does. Without this, anyone who
// can label a namespace could send its traffic through, and have it
// authorized by, a waypoint of another team.
func WaypointAdmits(gw *gwv1.Gateway, ns string, nsLabels map[string]string) bool {
	if gw.Namespace == ns {
		return true
	}
	for _, l := range gw.Spec.Listeners {
		if string(l.Protocol) != WaypointProtocol {
			continue
		}
		return listenerAdmits(gw.Namespace, l, ns, nsLabels)
	}
	return false
}

func notAdmitted(ref *nsName, ns string) string {
	return fmt.Sprintf("waypoint %s does not admit namespace %s (its %s listener's allowedRoutes.namespaces must be from All, or a Selector matching the namespace)",
		ref, ns, WaypointProtocol)
}

// preparePods parses each pod's addresses, readiness and annotations and
// finds waypoint pods, refusing pods that do not parse.
func (t *translator) preparePods() {
	uids := map[string]*podInfo{}
	for _, id := range t.podOrder {
		p := t.pods[id]
		p.uid = string(p.pod.UID)
		if p.uid == "" {
			p.uid = id.String()
		}
		p.active = p.pod.Status.Phase != corev1.PodSucceeded && p.pod.Status.Phase != corev1.PodFailed
		p.ready = true
		for _, c := range p.pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse {
				p.ready = false
			}
		}
		for _, f := range [][2]string{{"spec.hostname", p.pod.Spec.Hostname}, {"spec.subdomain", p.pod.Spec.Subdomain}} {
			if why := badLabel(f[1]); why != "" {
				t.problem(p.origin, p.obj, "%s %q: %s", f[0], f[1], why)
			}
		}
		p.serving = map[uint32]struct{}{}
		if !p.pod.Spec.HostNetwork {
			// Host-network pods share their node's address; they are not addressable workloads.
			raw := make([]string, 0, 2)
			for _, ip := range p.pod.Status.PodIPs {
				raw = append(raw, ip.IP)
			}
			if len(raw) == 0 && p.pod.Status.PodIP != "" {
				raw = append(raw, p.pod.Status.PodIP)
			}
			for _, s := range raw {
				a, err := parseIP(s)
				if err != nil {
					t.problem(p.origin, p.obj, "pod IP: %v", err)
					continue
				}
				if !containsStr(p.ips, a) {
					p.ips = append(p.ips, a)
				}
			}
		}
		for _, c := range p.pod.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP {
					p.serving[uint32(cp.ContainerPort)] = struct{}{}
				}
			}
		}
		if gwName := p.pod.Labels[LabelGatewayName]; gwName != "" {
			g := t.gateways[nsName{id.ns, gwName}]
			switch {
			case g == nil:
				t.problem(p.origin, p.obj, "dangling reference: label %s=%s names Gateway %s/%s, which does not exist",
					LabelGatewayName, gwName, id.ns, gwName)
			case g.out != nil:
				p.waypoint = g
			case string(g.gw.Spec.GatewayClassName) == IngressClass:
				p.ingress = g
			}
		}
		if !p.active {
			continue // finished pods are no workloads: nothing more to check
		}
		if prev, dup := uids[p.uid]; dup {
			// Workloads are known by uid: neither can be told apart.
			t.problem(p.origin, p.obj, "uid %s is also used by %s", p.uid, prev.obj)
			t.problem(prev.origin, prev.obj, "uid %s is also used by %s", p.uid, p.obj)
		}
		uids[p.uid] = p
		t.out.claims = append(t.out.claims, "uid "+p.uid)
		if _, err := trust.NewIdentity(t.opts.TrustDomain, id.ns, podServiceAccount(p.pod)); err != nil {
			t.problem(p.origin, p.obj, "identity: %v", err)
		}
		if a, ok := p.pod.Annotations[AnnotationAppAddress]; ok {
			addr, err := parseIP(a)
			if err != nil {
				t.problem(p.origin, p.obj, "annotation %s: %v", AnnotationAppAddress, err)
			}
			p.appAddr = addr
		}
		if app, ok := p.pod.Annotations[AnnotationLocalApp]; ok {
			switch {
			case strings.TrimSpace(app) == "":
				t.problem(p.origin, p.obj, "annotation %s: empty (name echo or a command line)", AnnotationLocalApp)
			case p.waypoint != nil:
				t.problem(p.origin, p.obj, "annotation %s: a waypoint's pod runs the waypoint, not an app", AnnotationLocalApp)
			}
		}
	}
}

// resolveWaypointPods gives each waypoint its identity and addresses from
// its pods. Pods of one waypoint must share a service account; one that
// differs is refused (the deployer's account, named after the Gateway,
// wins; else the first pod's), so a stray pod cannot take the waypoint down.
func (t *translator) resolveWaypointPods() {
	for _, id := range t.gwOrder {
		g := t.gateways[id]
		if g.out == nil {
			continue
		}
		var pods []*podInfo
		sa := ""
		for _, pid := range t.podsByNS[id.ns] { // a waypoint's pods are in its namespace
			p := t.pods[pid]
			if p.waypoint != g || !p.active || t.refused(p.obj) {
				continue
			}
			pods = append(pods, p)
			if psa := podServiceAccount(p.pod); sa == "" || psa == id.name {
				sa = psa
			}
		}
		if sa == "" {
			sa = id.name // Istio's convention: the waypoint's service account bears the Gateway's name
		}
		// Node proxies dial these addresses: only pods that serve. A pod
		// not yet ready may still wait for its certificate (a handshake
		// then stalls) and a terminating one is about to close its
		// listener and lose its network namespace (a dial then goes
		// nowhere until it times out). As kube-proxy does, terminating
		// pods that still report ready are used only when no other pod is.
		var addrs, terminating []string
		for _, p := range pods {
			if psa := podServiceAccount(p.pod); psa != sa {
				t.problem(p.origin, p.obj, "waypoint %s has pods with different service accounts (%s and %s)", id, sa, psa)
				continue
			}
			switch {
			case !p.ready:
			case p.pod.DeletionTimestamp != nil:
				terminating = append(terminating, p.ips...)
			default:
				addrs = append(addrs, p.ips...)
			}
		}
		if len(addrs) == 0 {
			addrs = terminating
		}
		ident, err := trust.NewIdentity(t.opts.TrustDomain, id.ns, sa)
		if err != nil {
			t.problem(g.origin, "Gateway "+id.String(), "identity: %v", err)
			g.out = nil
			continue
		}
		g.out.Identity = ident.String()
		sort.Strings(addrs) // the same resource whatever order the source lists pods in
		g.out.Addresses = addrs
		t.out.waypointIdentities[g.out.Identity] = id.String()
		t.out.Waypoints[id.String()] = g.out
	}
}

// checkPodIdentities refuses a pod (other than a waypoint's own) whose
// service account is a waypoint's identity: its node proxy, or its own
// service-account token, would get the waypoint's certificate and pass the
// waypoint-only check of every pod behind it.
func (t *translator) checkPodIdentities() {
	for _, id := range t.podOrder {
		p := t.pods[id]
		if !p.active || p.waypoint != nil || t.refused(p.obj) {
			continue
		}
		sa := podServiceAccount(p.pod)
		if p.ingress != nil && sa == p.ingress.gw.Name {
			continue // an ingress Gateway's own pod holds its identity
		}
		ident, err := trust.NewIdentity(t.opts.TrustDomain, id.ns, sa)
		if err != nil {
			continue // refused by preparePods
		}
		if wp, clash := t.out.waypointIdentities[ident.String()]; clash {
			t.problem(p.origin, p.obj, "service account %s gives this pod the identity %s of waypoint %s, which only the waypoint's own pods may hold; "+
				"give the application its own service account", sa, ident, wp)
		}
	}
}

func podServiceAccount(p *corev1.Pod) string {
	if p.Spec.ServiceAccountName != "" {
		return p.Spec.ServiceAccountName
	}
	return "default"
}

// prepareServices parses the Services' cluster IPs.
func (t *translator) prepareServices() {
	for _, id := range t.svcOrder {
		s := t.services[id]
		if s.svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		ips := s.svc.Spec.ClusterIPs
		if len(ips) == 0 && s.svc.Spec.ClusterIP != "" {
			ips = []string{s.svc.Spec.ClusterIP}
		}
		for _, ip := range ips {
			if ip == "" || ip == corev1.ClusterIPNone {
				continue
			}
			a, err := parseIP(ip)
			if err != nil {
				t.problem(s.origin, "Service "+id.String(), "cluster IP: %v", err)
				continue
			}
			if !containsStr(s.vips, a) {
				s.vips = append(s.vips, a)
			}
		}
	}
}

// translateServices builds Services with their ports, VIPs, endpoints and
// waypoint binding. A refused Service, or one whose inherited binding names
// no usable waypoint, is served with invalid_reason: node proxies refuse
// its traffic rather than send it direct.
func (t *translator) translateServices() {
	for _, id := range t.svcOrder {
		s := t.services[id]
		obj := "Service " + id.String()
		if s.svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue // not part of the mesh; backends naming it are invalid
		}
		out := &meshv1.Service{
			Name:      id.name,
			Namespace: id.ns,
			Hostname:  id.name + "." + id.ns + ".svc." + t.opts.ClusterDomain,
			Vips:      s.vips,
		}
		for _, p := range s.svc.Spec.Ports {
			if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
				continue // the mesh carries TCP
			}
			sp := &meshv1.ServicePort{Name: p.Name, Port: uint32(p.Port)}
			switch {
			case p.TargetPort.Type == intstr.String:
				if n := p.TargetPort.StrVal; n == "" {
					sp.TargetPort = sp.Port
				} else if v, ok := numericPortName(n); ok {
					sp.TargetPort = v
				}
			case p.TargetPort.IntVal == 0:
				sp.TargetPort = sp.Port
			default:
				sp.TargetPort = uint32(p.TargetPort.IntVal)
			}
			if p.AppProtocol != nil {
				sp.AppProtocol = *p.AppProtocol
			}
			out.Ports = append(out.Ports, sp)
		}
		if slices := t.slices[id]; len(slices) > 0 {
			out.Endpoints = t.endpointsFromSlices(id, s, slices)
		} else {
			out.Endpoints = t.endpointsFromSelector(id, s)
		}
		sort.Slice(out.Endpoints, func(i, j int) bool {
			if out.Endpoints[i].Address != out.Endpoints[j].Address {
				return out.Endpoints[i].Address < out.Endpoints[j].Address
			}
			return out.Endpoints[i].WorkloadUid < out.Endpoints[j].WorkloadUid
		})
		out.TrafficDistribution = trafficDistribution(s)
		var inherited string
		out.Waypoint, inherited = t.bindWaypoint(s.svc.Labels, id.ns, meshv1.WaypointForService)
		switch {
		case t.refused(obj):
			out.InvalidReason = strings.Join(t.reasons[obj], "; ")
		case inherited != "":
			out.InvalidReason = fmt.Sprintf("namespace %s: %s=%s: %s", id.ns, LabelUseWaypoint, t.namespaces[id.ns].labels()[LabelUseWaypoint], inherited)
		}
		s.out = out
		t.out.Services[id.String()] = out
	}
}

// trafficDistribution is s's spec.trafficDistribution: PreferSameNode;
// PreferClose or PreferSameZone (its newer name); any other value, as
// kube-proxy does, states no preference. nil (no such Service) neither.
func trafficDistribution(s *serviceInfo) meshv1.TrafficDistribution {
	if s == nil || s.svc.Spec.TrafficDistribution == nil {
		return meshv1.TrafficDistribution_ANY
	}
	switch *s.svc.Spec.TrafficDistribution {
	case corev1.ServiceTrafficDistributionPreferSameNode:
		return meshv1.TrafficDistribution_PREFER_SAME_NODE
	case corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone:
		return meshv1.TrafficDistribution_PREFER_CLOSE
	}
	return meshv1.TrafficDistribution_ANY
}

// nodeLocality is n's region and zone labels, or nil when it has neither.
func nodeLocality(n *corev1.Node) *meshv1.Locality {
	l := &meshv1.Locality{Region: n.Labels[corev1.LabelTopologyRegion], Zone: n.Labels[corev1.LabelTopologyZone]}
	if l.Region == "" && l.Zone == "" {
		return nil
	}
	return l
}

func numericPortName(s string) (uint32, bool) {
	var v uint32
	if _, err := fmt.Sscanf(s, "%d", &v); err != nil || fmt.Sprint(v) != s {
		return 0, false
	}
	return v, true
}

// svcPort finds the Kubernetes ServicePort a meshv1 port came from.
func svcPort(svc *corev1.Service, port uint32) *corev1.ServicePort {
	for i := range svc.Spec.Ports {
		if uint32(svc.Spec.Ports[i].Port) == port {
			return &svc.Spec.Ports[i]
		}
	}
	return nil
}

// endpointsFromSlices joins the Service's EndpointSlices (any number, by
// label kubernetes.io/service-name) as kube-proxy does: ready endpoints
// (ready unset means ready); when there are none, the serving endpoints of
// terminating pods, so connections still find a backend while a rollout
// drains the last ones.
func (t *translator) endpointsFromSlices(id nsName, s *serviceInfo, slices []*sliceInfo) []*meshv1.Endpoint {
	type candidate struct {
		ep  *meshv1.Endpoint
		pod *podInfo
	}
	var ready, terminating []candidate
	seen := map[string]bool{} // readiness|uid|address
	for _, si := range slices {
		sl := si.slice
		obj := "EndpointSlice " + id.ns + "/" + sl.Name
		if sl.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		byName := map[string]uint32{}
		for _, p := range sl.Ports {
			if p.Port == nil || (p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP) {
				continue
			}
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			byName[name] = uint32(*p.Port)
		}
		ports := map[uint32]uint32{}
		for _, p := range s.svc.Spec.Ports {
			if tp, ok := byName[p.Name]; ok && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
				ports[uint32(p.Port)] = tp
			}
		}
		for _, ep := range sl.Endpoints {
			c := ep.Conditions
			isReady := c.Ready == nil || *c.Ready
			isServing := c.Serving == nil && isReady || c.Serving != nil && *c.Serving
			isTerminating := c.Terminating != nil && *c.Terminating
			if !isReady && !(isServing && isTerminating) {
				continue
			}
			uid := ""
			var pod *podInfo
			if ref := ep.TargetRef; ref != nil && ref.Kind == "Pod" {
				pns := ref.Namespace
				if pns == "" {
					pns = id.ns
				}
				t.out.crossNamespace = t.out.crossNamespace || pns != id.ns
				pod = t.pods[nsName{pns, ref.Name}]
				if pod == nil {
					t.problem(si.origin, obj, "dangling reference: endpoint targets Pod %s/%s, which does not exist", pns, ref.Name)
					continue
				}
				if t.refused(pod.obj) {
					continue // the pod's own refusal says why
				}
				uid = pod.uid
			}
			if why := badLabel(ptrValue(ep.Hostname)); why != "" {
				t.problem(si.origin, obj, "endpoint hostname %q: %s", *ep.Hostname, why)
				continue
			}
			for _, addr := range ep.Addresses {
				a, err := parseIP(addr)
				if err != nil {
					t.problem(si.origin, obj, "endpoint address: %v", err)
					continue
				}
				key := fmt.Sprintf("%t|%s|%s", isReady, uid, a)
				if seen[key] {
					continue
				}
				seen[key] = true
				cand := candidate{ep: &meshv1.Endpoint{WorkloadUid: uid, Address: a, Ports: ports, Hostname: t.endpointHostname(s, ptrValue(ep.Hostname))}, pod: pod}
				if isReady {
					ready = append(ready, cand)
				} else {
					terminating = append(terminating, cand)
				}
			}
		}
	}
	if len(ready) == 0 {
		ready = terminating
	}
	out := make([]*meshv1.Endpoint, 0, len(ready))
	for _, c := range ready {
		out = append(out, c.ep)
		if c.pod != nil {
			for _, tp := range c.ep.Ports {
				c.pod.serving[tp] = struct{}{}
			}
		}
	}
	return out
}

// endpointHostname is the per-pod DNS name of an endpoint of a headless
// Service (<hostname>.<service>.<namespace>.svc.<domain>, as cluster DNS
// publishes it for StatefulSet pods), or "" when there is none. Hostnames
// are checked where they are read (pods, slices).
func (t *translator) endpointHostname(s *serviceInfo, hostname string) string {
	if hostname == "" || s.svc.Spec.ClusterIP != corev1.ClusterIPNone {
		return ""
	}
	return hostname + "." + s.svc.Name + "." + s.svc.Namespace + ".svc." + t.opts.ClusterDomain
}

// badLabel explains why s is not a DNS label (RFC 1123), or returns "".
func badLabel(s string) string {
	if s == "" {
		return ""
	}
	return strings.Join(validation.IsDNS1123Label(s), "; ")
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// endpointsFromSelector derives endpoints as the EndpointSlice controller
// would: active, ready (unless publishNotReadyAddresses) pods of the
// namespace whose labels match the selector, each service port resolved on
// the pod (a named target port the pod does not declare leaves that port out).
func (t *translator) endpointsFromSelector(id nsName, s *serviceInfo) []*meshv1.Endpoint {
	if len(s.svc.Spec.Selector) == 0 {
		return nil
	}
	sel := labels.SelectorFromSet(s.svc.Spec.Selector)
	var out []*meshv1.Endpoint
	for _, pid := range t.podsByNS[id.ns] {
		p := t.pods[pid]
		if !p.active || len(p.ips) == 0 || t.refused(p.obj) || !sel.Matches(labels.Set(p.pod.Labels)) {
			continue
		}
		if !p.ready && !s.svc.Spec.PublishNotReadyAddresses {
			continue
		}
		ports := map[uint32]uint32{}
		tcpPorts := 0
		for _, sp := range s.svc.Spec.Ports {
			if sp.Protocol != "" && sp.Protocol != corev1.ProtocolTCP {
				continue
			}
			tcpPorts++
			if tp, ok := resolveTargetPort(sp, p.pod); ok {
				ports[uint32(sp.Port)] = tp
				p.serving[tp] = struct{}{}
			}
		}
		if tcpPorts > 0 && len(ports) == 0 {
			continue
		}
		host := ""
		if p.pod.Spec.Subdomain == id.name {
			host = t.endpointHostname(s, p.pod.Spec.Hostname)
		}
		for _, a := range p.ips {
			out = append(out, &meshv1.Endpoint{WorkloadUid: p.uid, Address: a, Ports: ports, Hostname: host})
		}
	}
	return out
}

// resolveTargetPort returns the pod port a service port forwards to.
func resolveTargetPort(sp corev1.ServicePort, pod *corev1.Pod) (uint32, bool) {
	tp := sp.TargetPort
	if tp.Type == intstr.Int {
		if tp.IntVal == 0 {
			return uint32(sp.Port), true
		}
		return uint32(tp.IntVal), true
	}
	if tp.StrVal == "" {
		return uint32(sp.Port), true
	}
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == tp.StrVal && (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) {
				return uint32(cp.ContainerPort), true
			}
		}
	}
	if v, ok := numericPortName(tp.StrVal); ok {
		return v, true
	}
	return 0, false
}

// translateWorkloads turns the pods that are not refused into Workloads
// and builds the node index. A pod whose namespace's binding names no
// usable waypoint is served with invalid_reason (its traffic is refused);
// its own label naming none refused the pod already.
func (t *translator) translateWorkloads() {
	for _, id := range t.podOrder {
		p := t.pods[id]
		if !p.active || t.refused(p.obj) {
			continue
		}
		sa := podServiceAccount(p.pod)
		ident, _ := trust.NewIdentity(t.opts.TrustDomain, id.ns, sa) // checked by preparePods
		w := &meshv1.Workload{
			Uid:            p.uid,
			Name:           id.name,
			Namespace:      id.ns,
			ServiceAccount: sa,
			Identity:       ident.String(),
			Node:           p.pod.Spec.NodeName,
			Addresses:      p.ips,
			Labels:         p.pod.Labels,
			AppAddress:     p.appAddr,
			Locality:       t.nodes[p.pod.Spec.NodeName],
		}
		nameWorkload(w, p.pod)
		if app, ok := p.pod.Annotations[AnnotationLocalApp]; ok {
			t.out.LocalApps[p.uid] = app
		}
		for port := range p.serving {
			w.ServingPorts = append(w.ServingPorts, port)
		}
		sort.Slice(w.ServingPorts, func(i, j int) bool { return w.ServingPorts[i] < w.ServingPorts[j] })
		if p.waypoint != nil {
			// A waypoint listens on its own pod IP: never captured, never bound.
			w.WaypointForGateway = &meshv1.Ref{Namespace: id.ns, Name: p.waypoint.gw.Name}
		} else if p.ingress == nil { // an ingress Gateway's pod opens its own tunnels: never captured, never bound
			w.Hbone = t.enrolled(p.pod)
			var inherited string
			if w.Waypoint, inherited = t.bindWaypoint(p.pod.Labels, id.ns, meshv1.WaypointForWorkload); inherited != "" {
				w.InvalidReason = fmt.Sprintf("namespace %s: %s=%s: %s", id.ns, LabelUseWaypoint, t.namespaces[id.ns].labels()[LabelUseWaypoint], inherited)
			}
		}
		t.out.Workloads[w.Uid] = w
		if w.Hbone && w.Node != "" && w.InvalidReason == "" {
			ids := t.out.nodeIdentities[w.Node]
			if ids == nil {
				ids = map[string]struct{}{}
				t.out.nodeIdentities[w.Node] = ids
			}
			ids[w.Identity] = struct{}{}
		}
	}
}

// enrolled: dataplane-mode on the Pod decides (mesh or none), else the Namespace's.
func (t *translator) enrolled(p *corev1.Pod) bool {
	if p.Spec.HostNetwork {
		return false
	}
	if v, ok := p.Labels[LabelDataplaneMode]; ok {
		return v == DataplaneModeMesh
	}
	return t.namespaces[p.Namespace].labels()[LabelDataplaneMode] == DataplaneModeMesh
}

// checkAddresses refuses every owner of an address claimed twice: pod
// IPs, app addresses and service VIPs share one space, since node proxies
// look destinations up by address, and neither claimant can be trusted with
// the other's traffic.
func (t *translator) checkAddresses() {
	type claim struct{ origin, obj, what string }
	owners := map[string][]claim{}
	var order []string
	add := func(origin, obj, addr, what string) {
		list := owners[addr]
		for _, c := range list {
			if c.obj == obj {
				return // a pod's app address may be one of its own IPs
			}
		}
		if len(list) == 0 {
			order = append(order, addr)
		}
		owners[addr] = append(list, claim{origin, obj, what})
	}
	for _, id := range t.podOrder {
		p := t.pods[id]
		if !p.active || t.refused(p.obj) {
			continue
		}
		for _, a := range p.ips {
			add(p.origin, p.obj, a, "pod IP")
		}
		if p.appAddr != "" {
			add(p.origin, p.obj, p.appAddr, "app address")
		}
	}
	for _, id := range t.svcOrder {
		s := t.services[id]
		for _, v := range s.vips {
			add(s.origin, "Service "+id.String(), v, "VIP")
		}
	}
	t.out.claims = append(t.out.claims, order...)
	for _, addr := range order {
		list := owners[addr]
		if len(list) < 2 {
			continue
		}
		for i, c := range list {
			other := list[(i+1)%len(list)]
			t.problem(c.origin, c.obj, "duplicate address: %s %s is also used by %s", c.what, addr, other.obj)
		}
	}
}

// checkOutput runs the consumer-side validation on everything produced, so
// the control plane never serves what a client would NACK. The passes
// before it check their input, so a failure here is a translation bug: the
// resource is left out (a Service is replaced by one refusing its traffic)
// and reported.
func (t *translator) checkOutput() {
	for typeURL, res := range t.out.Resources() {
		names := make([]string, 0, len(res))
		for n := range res {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			err := meshv1.Validate(res[n])
			if err == nil {
				continue
			}
			obj := kindOf[typeURL] + " " + n
			if w, ok := res[n].(*meshv1.Workload); ok {
				obj = "Pod " + w.Namespace + "/" + w.Name // the pod it came from
			}
			t.problem("translation", obj, "%v", err)
			switch typeURL {
			case meshv1.WorkloadTypeURL:
				delete(t.out.Workloads, n)
			case meshv1.ServiceTypeURL:
				s := t.out.Services[n]
				refusing := &meshv1.Service{Name: s.Name, Namespace: s.Namespace, Hostname: s.Hostname, Vips: s.Vips, InvalidReason: err.Error()}
				if meshv1.Validate(refusing) == nil {
					t.out.Services[n] = refusing
				} else {
					delete(t.out.Services, n)
				}
			case meshv1.WaypointTypeURL:
				delete(t.out.Waypoints, n)
			case meshv1.HTTPRouteTypeURL:
				delete(t.out.HTTPRoutes, n)
			case meshv1.GRPCRouteTypeURL:
				delete(t.out.GRPCRoutes, n)
			case meshv1.IngressGatewayTypeURL:
				delete(t.out.IngressGateways, n)
			}
		}
	}
}

var kindOf = map[string]string{
	meshv1.ServiceTypeURL: "Service", meshv1.WaypointTypeURL: "Waypoint",
	meshv1.HTTPRouteTypeURL: "HTTPRoute", meshv1.GRPCRouteTypeURL: "GRPCRoute",
	meshv1.IngressGatewayTypeURL: "Gateway",
}

func parseIP(s string) (string, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || a.Zone() != "" || a.IsUnspecified() {
		return "", fmt.Errorf("%q is not a usable IP address", s)
	}
	return a.Unmap().String(), nil
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
