package trust

// WorkloadIndex answers the CA's node-authorization question: is a
// workload with identity id scheduled on node? The control plane's
// configuration model implements it.
type WorkloadIndex interface {
	HasWorkload(node string, id Identity) bool
}

// Workload is one entry of a WorkloadList.
type Workload struct {
	Node     string
	Identity Identity
}

// WorkloadList is a WorkloadIndex over a fixed list (tests, static setups).
type WorkloadList []Workload

// HasWorkload implements WorkloadIndex.
func (l WorkloadList) HasWorkload(node string, id Identity) bool {
	for _, w := range l {
		if w.Node == node && w.Identity == id {
			return true
		}
	}
	return false
}
