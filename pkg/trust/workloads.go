package trust

// WorkloadIndex answers the CA's node-authorization questions: is a
// workload with identity id scheduled on node, and is id a waypoint's
// identity (which no node proxy may hold)? The control plane's
// configuration model implements it.
type WorkloadIndex interface {
	HasWorkload(node string, id Identity) bool
	IsWaypoint(id Identity) bool
}

// WorkloadChanges is a WorkloadIndex whose answers follow a changing
// cluster: Changed returns a channel closed at its next change, after
// which a question answered no may be answered yes. In Kubernetes a node
// proxy learns a new pod from its node (the CNI plugin, the node agent)
// before the control plane's configuration holds it, so the CA waits for
// that, bounded, before it refuses (caserver.Options.WorkloadWait).
type WorkloadChanges interface {
	WorkloadIndex
	Changed() <-chan struct{}
}

// Workload is one entry of a WorkloadList: a workload on Node, or with
// Waypoint set, a waypoint's identity.
type Workload struct {
	Node     string
	Identity Identity
	Waypoint bool
}

// WorkloadList is a WorkloadIndex over a fixed list (tests, static setups).
type WorkloadList []Workload

// HasWorkload implements WorkloadIndex.
func (l WorkloadList) HasWorkload(node string, id Identity) bool {
	for _, w := range l {
		if !w.Waypoint && w.Node == node && w.Identity == id {
			return true
		}
	}
	return false
}

// IsWaypoint implements WorkloadIndex.
func (l WorkloadList) IsWaypoint(id Identity) bool {
	for _, w := range l {
		if w.Waypoint && w.Identity == id {
			return true
		}
	}
	return false
}
