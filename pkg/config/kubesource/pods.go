package kubesource

import (
	"errors"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn/tokenreview"
)

// errNotSynced: the pod informer has not listed the cluster yet.
var errNotSynced = errors.New("the pod informer has not synced yet")

func podIndexKey(node, namespace, serviceAccount string) string {
	return node + "/" + namespace + "/" + serviceAccount
}

func indexPodByNodeAndAccount(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return nil, nil
	}
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	return []string{podIndexKey(p.Spec.NodeName, p.Namespace, sa)}, nil
}

// Pod implements tokenreview.PodLookup from the pod informer.
func (s *Source) Pod(namespace, name string) (tokenreview.PodInfo, bool, error) {
	if !s.podsSynced() {
		return tokenreview.PodInfo{}, false, errNotSynced
	}
	p, err := s.pods.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return tokenreview.PodInfo{}, false, nil
	}
	if err != nil {
		return tokenreview.PodInfo{}, false, err
	}
	return tokenreview.PodInfo{UID: string(p.UID), Node: p.Spec.NodeName}, true, nil
}

// HasWorkload implements trust.WorkloadIndex: a node proxy on node may
// have identity id only while a pod with that identity is scheduled there,
// has not finished, and is captured by the node proxy: enrolled in the mesh
// (label causeway.dev/dataplane-mode on the pod, else on its namespace), not
// host-network, and not a waypoint's own pod (a waypoint's identity is its
// own to ask for, never its node proxy's). Pending pods count: a node proxy
// fetches a pod's certificate while its sandbox is being set up.
//
// Both views must agree: the pod informer, which sees a deleted or moved
// pod before the next snapshot does, and the last good snapshot, whose
// translation refuses pods the mesh cannot serve (a duplicate address, a
// broken annotation); a refused pod is no workload, so it gives its node
// proxy no certificate either. A node proxy that learns a pod from its node
// (in-pod capture: the node agent hands it over at the pod's start) can ask
// before the snapshot holds the pod; the CA then waits for the next
// snapshots (Changed), bounded, before it refuses.
func (s *Source) HasWorkload(node string, id trust.Identity) bool {
	if node == "" || id.IsZero() || !s.podsSynced() {
		return false
	}
	if !s.last.Load().HasWorkload(node, id) {
		return false
	}
	if id.TrustDomain().Name() != s.trustDomain() {
		return false
	}
	objs, err := s.podIndex.ByIndex(podIndexName, podIndexKey(node, id.Namespace(), id.ServiceAccount()))
	if err != nil {
		return false
	}
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if p.Spec.HostNetwork || p.Labels[config.LabelGatewayName] != "" {
			continue
		}
		if s.enrolled(p) {
			return true
		}
	}
	return false
}

// Changed implements trust.WorkloadChanges: the channel closes at the
// next good snapshot, the view HasWorkload waits for (the pod informer
// sees a pod before the snapshot that serves it).
func (s *Source) Changed() <-chan struct{} {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.waiters == nil {
		s.waiters = make(chan struct{})
	}
	return s.waiters
}

// IsWaypoint implements trust.WorkloadIndex from the last good snapshot:
// the translation decides which identities are waypoints', as in local mode.
func (s *Source) IsWaypoint(id trust.Identity) bool {
	return s.last.Load().IsWaypoint(id)
}

func (s *Source) enrolled(p *corev1.Pod) bool {
	if v, ok := p.Labels[config.LabelDataplaneMode]; ok {
		return v == config.DataplaneModeMesh
	}
	ns, err := s.namespaces.Get(p.Namespace)
	return err == nil && ns.Labels[config.LabelDataplaneMode] == config.DataplaneModeMesh
}

func (s *Source) trustDomain() string {
	if td := s.opts.Translate.TrustDomain; td != "" {
		return td
	}
	return trust.DefaultTrustDomain
}

var (
	_ tokenreview.PodLookup = (*Source)(nil)
	_ trust.WorkloadChanges = (*Source)(nil)
)
