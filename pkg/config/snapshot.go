// Package config turns the mesh's configuration (Kubernetes objects: Pods,
// Services, EndpointSlices, Namespaces, Gateway API waypoints and routes) into
// the resources the control plane serves (pkg/xds/meshv1), following the rules
// of docs/design.md §6. Sources (a watched directory now, Kubernetes informers later)
// produce []Object; Translate turns them into a Snapshot; a Model holds the
// snapshot in force and answers the CA's node-authorization question.
package config

import (
	"sort"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Labels and annotations the translation reads.
const (
	LabelUseWaypoint          = "causeway.dev/use-waypoint"
	LabelUseWaypointNamespace = "causeway.dev/use-waypoint-namespace"
	LabelDataplaneMode        = "causeway.dev/dataplane-mode"
	LabelWaypointFor          = "causeway.dev/waypoint-for"
	AnnotationAppAddress      = "causeway.dev/app-address"
	AnnotationLocalApp        = "causeway.dev/local-app"
	LabelGatewayName          = "gateway.networking.k8s.io/gateway-name"
	LabelServiceName          = "kubernetes.io/service-name"

	// DataplaneModeMesh enrolls pods; DataplaneModeNone on a Pod opts it out
	// of a Namespace that is enrolled.
	DataplaneModeMesh = "mesh"
	DataplaneModeNone = "none"
	// UseWaypointNone on a more specific object cancels a binding inherited
	// from a less specific one.
	UseWaypointNone = "none"
	// WaypointClass is the gatewayClassName of waypoints.
	WaypointClass = "causeway-waypoint"
	// WaypointProtocol is the listener protocol of a waypoint.
	WaypointProtocol = "HBONE"
	// IngressClass is the gatewayClassName of ingress Gateways: entry
	// points for traffic from outside the mesh, deployed by the control
	// plane as waypoints are, serving HTTP and HTTPS listeners
	// (docs/ingress.md).
	IngressClass = "causeway"
	// WaypointController and IngressController are the controllerNames
	// of the waypoint class and of the ingress class (IngressClass).
	WaypointController = "causeway.dev/waypoint-controller"
	IngressController  = "causeway.dev/gateway-controller"
)

// Options parameterise the translation.
type Options struct {
	// TrustDomain of workload identities (default cluster.local).
	TrustDomain string
	// ClusterDomain of service hostnames (default cluster.local).
	ClusterDomain string
}

func (o Options) withDefaults() Options {
	if o.TrustDomain == "" {
		o.TrustDomain = trust.DefaultTrustDomain
	}
	if o.ClusterDomain == "" {
		o.ClusterDomain = "cluster.local"
	}
	return o
}

// Snapshot is one complete, validated translation. It is immutable once
// built: readers share it without locks, and its messages must not be
// modified.
type Snapshot struct {
	// Rejected lists the objects the translation refused, with why; each
	// fails closed as Translate describes and the rest is served.
	Rejected []Problem

	// Set holds the resources served; its ConnectionPolicies come
	// without their policy files (AttachPolicy adds them).
	meshv1.Set
	// LocalApps are the applications local mode starts for pods (annotation
	// causeway.dev/local-app), by workload uid. No proxy reads them.
	LocalApps map[string]string

	// ChangedAt is when the source saw the first change this snapshot
	// includes that the one before it did not (zero: unknown). Push
	// latency counts from it.
	ChangedAt time.Time

	// nodeIdentities: node -> identities of captured workloads on that node.
	nodeIdentities map[string]map[string]struct{}
	// waypointIdentities: identity -> the waypoint ("<ns>/<name>") whose
	// pods alone hold it.
	waypointIdentities map[string]string
	// claims are the addresses and uids the translation saw claimed, and
	// crossNamespace whether an object refers to a pod of another
	// namespace: what Incremental must decide across namespaces.
	claims         []string
	crossNamespace bool
}

func newSnapshot() *Snapshot {
	return &Snapshot{
		Set:                meshv1.NewSet(),
		LocalApps:          map[string]string{},
		nodeIdentities:     map[string]map[string]struct{}{},
		waypointIdentities: map[string]string{},
	}
}

// Resources returns the snapshot's resources by type URL and resource name,
// the shape the xDS server takes.
func (s *Snapshot) Resources() map[string]map[string]proto.Message {
	out := make(map[string]map[string]proto.Message, len(meshv1.TypeURLs))
	for _, t := range meshv1.TypeURLs {
		out[t] = s.Messages(t)
	}
	return out
}

// HasWorkload reports whether a captured (mesh-enrolled, non-waypoint)
// workload with identity id is scheduled on node. The CA grants a node proxy
// an identity only when this holds; waypoint pods are not captured and ask
// for their own identity instead.
func (s *Snapshot) HasWorkload(node string, id trust.Identity) bool {
	if s == nil || node == "" || id.IsZero() {
		return false
	}
	_, ok := s.nodeIdentities[node][id.String()]
	return ok
}

// IsWaypoint reports whether id is a waypoint's identity. The CA never
// grants it to a node proxy, whatever runs on the node.
func (s *Snapshot) IsWaypoint(id trust.Identity) bool {
	if s == nil {
		return false
	}
	_, ok := s.waypointIdentities[id.String()]
	return ok
}

// NodeIdentities lists the identities of captured workloads on node, sorted.
func (s *Snapshot) NodeIdentities(node string) []string {
	if s == nil {
		return nil
	}
	out := make([]string, 0, len(s.nodeIdentities[node]))
	for id := range s.nodeIdentities[node] {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Model holds the snapshot in force. It is the single index both the xDS
// server and the CA's node authorization read, so they never disagree about
// which workloads exist.
type Model struct {
	cur atomic.Pointer[Snapshot]
}

// Set installs a new snapshot.
func (m *Model) Set(s *Snapshot) { m.cur.Store(s) }

// Current returns the snapshot in force, or nil before the first good configuration.
func (m *Model) Current() *Snapshot { return m.cur.Load() }

// HasWorkload answers the CA's node-authorization question against the
// snapshot in force (trust.WorkloadIndex). Before the first good
// configuration nothing is authorized.
func (m *Model) HasWorkload(node string, id trust.Identity) bool {
	return m.cur.Load().HasWorkload(node, id)
}

// IsWaypoint answers against the snapshot in force (trust.WorkloadIndex).
func (m *Model) IsWaypoint(id trust.Identity) bool {
	return m.cur.Load().IsWaypoint(id)
}

// Both the snapshot and the model answer the CA's node-authorization question.
var (
	_ trust.WorkloadIndex = (*Snapshot)(nil)
	_ trust.WorkloadIndex = (*Model)(nil)
)
