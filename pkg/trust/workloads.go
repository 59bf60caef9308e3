package trust

// WorkloadIndex answers the CA's node-authorization questions: is a
// workload with identity id scheduled on node, and is id a waypoint's
// identity (which no node proxy may hold)? The control plane's
// configuration model implements it.
type WorkloadIndex interface {
	HasWorkload(node string, id Identity) bool
	IsWaypoint(id Identity) bool
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
