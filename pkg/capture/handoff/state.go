package handoff

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// PodHandler is the node proxy's side of capture: it serves a pod inside
// its network namespace, and stops.
type PodHandler interface {
	// AddPod starts serving pod inside netns; it takes ownership of netns.
	AddPod(ctx context.Context, pod Pod, netns *os.File) error
	// RemovePod stops serving the pod, closing its listeners and connections.
	RemovePod(uid string)
}

// State is the node proxy's record of the pods handed to it. It never sees
// the socket: the client feeds it messages, as tests do.
type State struct {
	h PodHandler

	mu       sync.Mutex
	pods     map[string]netnsID
	replayed map[string]bool // since the connection began; nil once the snapshot is complete
}

// netnsID tells namespaces apart: a pod whose sandbox was recreated keeps
// its uid but has a new namespace.
type netnsID struct{ dev, ino uint64 }

// NewState records pods for h.
func NewState(h PodHandler) *State {
	return &State{h: h, pods: map[string]netnsID{}}
}

// Connected starts a snapshot: the agent replays its pods next.
func (s *State) Connected() {
	s.mu.Lock()
	s.replayed = map[string]bool{}
	s.mu.Unlock()
}

// Handle acts on one message from the agent; its error goes back in the ack.
// It owns netns.
func (s *State) Handle(ctx context.Context, m Message, netns *os.File) error {
	switch m.Type {
	case TypeAdd:
		return s.add(ctx, *m.Pod, netns)
	case TypeRemove:
		s.remove(m.UID)
		return nil
	case TypeSnapshotComplete:
		s.completeSnapshot()
		return nil
	}
	if netns != nil {
		netns.Close()
	}
	return errors.New("handoff: unexpected " + m.Type + " from the agent")
}

func (s *State) add(ctx context.Context, pod Pod, netns *os.File) error {
	id, err := identify(netns)
	if err != nil {
		netns.Close()
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.replayed != nil {
		s.replayed[pod.UID] = true
	}
	if have, ok := s.pods[pod.UID]; ok {
		if have == id {
			netns.Close() // a replay of what is already served
			return nil
		}
		s.h.RemovePod(pod.UID) // same pod, new sandbox
		delete(s.pods, pod.UID)
	}
	if err := s.h.AddPod(ctx, pod, netns); err != nil {
		return err
	}
	s.pods[pod.UID] = id
	return nil
}

func (s *State) remove(uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pods[uid]; ok {
		s.h.RemovePod(uid)
		delete(s.pods, uid)
	}
}

// completeSnapshot drops the pods the replay did not name.
func (s *State) completeSnapshot() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.replayed == nil {
		return
	}
	for uid := range s.pods {
		if !s.replayed[uid] {
			s.h.RemovePod(uid)
			delete(s.pods, uid)
		}
	}
	s.replayed = nil
}

// Pods lists the uids being served.
func (s *State) Pods() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.pods))
}

func identify(f *os.File) (netnsID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return netnsID{}, err
	}
	return netnsID{dev: st.Dev, ino: st.Ino}, nil
}
