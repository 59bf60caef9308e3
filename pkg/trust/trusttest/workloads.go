package trusttest

import (
	"sync"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// WorkloadIndex is a CA's view of which identities run on which node
// (trust.WorkloadChanges) that a test changes while the CA serves, as the
// control plane's snapshots change it.
type WorkloadIndex struct {
	mu      sync.Mutex
	list    trust.WorkloadList
	changed chan struct{}
}

// NewWorkloadIndex holds ws.
func NewWorkloadIndex(ws ...trust.Workload) *WorkloadIndex {
	return &WorkloadIndex{list: ws, changed: make(chan struct{})}
}

// Set replaces the workloads with ws.
func (x *WorkloadIndex) Set(ws ...trust.Workload) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.list = ws
	x.changedLocked()
}

// Add adds ws.
func (x *WorkloadIndex) Add(ws ...trust.Workload) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.list = append(x.list, ws...)
	x.changedLocked()
}

func (x *WorkloadIndex) changedLocked() {
	close(x.changed)
	x.changed = make(chan struct{})
}

func (x *WorkloadIndex) HasWorkload(node string, id trust.Identity) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.list.HasWorkload(node, id)
}

func (x *WorkloadIndex) IsWaypoint(id trust.Identity) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.list.IsWaypoint(id)
}

// Changed ends at the next Set or Add.
func (x *WorkloadIndex) Changed() <-chan struct{} {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.changed
}
