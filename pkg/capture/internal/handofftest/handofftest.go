// Package handofftest is a node proxy's side of the handoff for tests: it
// records the pods the agent hands over.
package handofftest

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/causeway-mesh/causeway/pkg/capture/handoff"
)

// Proxy is a handoff.PodHandler that keeps the pods, taking Delay to
// accept each.
type Proxy struct {
	Delay time.Duration

	mu   sync.Mutex
	pods map[string]*os.File
}

// AddPod records the pod.
func (p *Proxy) AddPod(_ context.Context, pod handoff.Pod, netns *os.File) error {
	time.Sleep(p.Delay)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pods == nil {
		p.pods = map[string]*os.File{}
	}
	p.pods[pod.UID] = netns
	return nil
}

// RemovePod forgets the pod.
func (p *Proxy) RemovePod(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.pods[uid]; ok {
		f.Close()
		delete(p.pods, uid)
	}
}

// Has reports whether the proxy holds the pod.
func (p *Proxy) Has(uid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.pods[uid]
	return ok
}
