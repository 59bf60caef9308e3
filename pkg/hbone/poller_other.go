//go:build !linux

package hbone

// idlePoller is Linux's; elsewhere a relay waits for its socket on a
// goroutine.
type idlePoller struct{}

func idlePollerFor() *idlePoller { return nil }

func (*idlePoller) park(*relay) bool { return false }

func (*idlePoller) forget(*relay) {}

const (
	peerRunning int32 = iota
	peerParked
	peerDone
)
