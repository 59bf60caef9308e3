package handoff

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Server is the node agent's end. It holds every captured pod's namespace,
// replays them to each node proxy that connects, and sends each change to
// every connected proxy (during a node proxy restart the old and the new
// one are both connected for a while).
type Server struct {
	Logger *zap.Logger
	// AckTimeout bounds the wait for each acknowledgement (default 5s); a
	// proxy that does not answer in time is disconnected.
	AckTimeout time.Duration

	mu    sync.Mutex
	pods  map[string]*captured
	conns map[*proxyConn]struct{}
}

type captured struct {
	pod   Pod
	netns *os.File
}

// proxyConn is one connected proxy. Only the holder of send writes, and
// acks are read by one reader goroutine and matched by order.
type proxyConn struct {
	conn *Conn
	send sync.Mutex
	acks chan Message
	done chan struct{}
}

func (s *Server) init() {
	if s.pods == nil {
		s.pods, s.conns = map[string]*captured{}, map[*proxyConn]struct{}{}
	}
	if s.Logger == nil {
		s.Logger = zap.NewNop()
	}
	if s.AckTimeout <= 0 {
		s.AckTimeout = 5 * time.Second
	}
}

// Serve accepts node proxies until ctx ends or ln fails.
func (s *Server) Serve(ctx context.Context, ln *net.UnixListener) error {
	s.mu.Lock()
	s.init()
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		uc, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("handoff: accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, newConn(uc))
		}()
	}
}

func (s *Server) serveConn(ctx context.Context, c *Conn) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	c.SetDeadline(time.Now().Add(s.AckTimeout))
	m, netns, err := c.Recv()
	if err == nil && m.Type != TypeHello {
		err = fmt.Errorf("first message is %s, want hello", m.Type)
		if netns != nil {
			netns.Close()
		}
	}
	if err != nil {
		s.Logger.Warn("node proxy connection refused", zap.Error(err))
		return
	}
	c.SetDeadline(time.Time{})
	pc := &proxyConn{conn: c, acks: make(chan Message, 1), done: make(chan struct{})}
	go pc.readAcks(s.Logger)

	// Registering and copying the pods in one step means a concurrent
	// AddPod is either in this replay or sent after it, never both.
	pc.send.Lock()
	s.mu.Lock()
	s.conns[pc] = struct{}{}
	replay := make([]*captured, 0, len(s.pods))
	for _, p := range s.pods {
		replay = append(replay, p)
	}
	s.mu.Unlock()
	defer s.drop(pc)
	sort.Slice(replay, func(i, j int) bool { return replay[i].pod.UID < replay[j].pod.UID })
	for _, p := range replay {
		if err := s.exchange(pc, Message{Type: TypeAdd, Pod: &p.pod}, p.netns); err != nil {
			pc.send.Unlock()
			s.Logger.Warn("replay to node proxy failed", zap.Stringer("pod", p.pod), zap.Error(err))
			if !errors.Is(err, errNacked) {
				return
			}
			pc.send.Lock()
		}
	}
	err = s.exchange(pc, Message{Type: TypeSnapshotComplete}, nil)
	pc.send.Unlock()
	if err != nil {
		s.Logger.Warn("snapshot to node proxy failed", zap.Error(err))
		return
	}
	s.Logger.Info("node proxy connected and replayed", zap.Int("pods", len(replay)))
	<-pc.done
}

func (pc *proxyConn) readAcks(log *zap.Logger) {
	defer close(pc.done)
	for {
		m, netns, err := pc.conn.Recv()
		if err != nil {
			return
		}
		if netns != nil {
			netns.Close()
		}
		if m.Type != TypeAck {
			log.Warn("node proxy sent an unexpected message; disconnecting", zap.String("type", m.Type))
			pc.conn.Close()
			return
		}
		select {
		case pc.acks <- m:
		default:
			log.Warn("node proxy sent an unrequested ack; disconnecting")
			pc.conn.Close()
			return
		}
	}
}

func (s *Server) drop(pc *proxyConn) {
	s.mu.Lock()
	delete(s.conns, pc)
	s.mu.Unlock()
	pc.conn.Close()
}

var errNacked = errors.New("node proxy refused")

// ErrNoProxy is returned by AddPod when no node proxy is connected.
var ErrNoProxy = errors.New("handoff: no node proxy is connected")

// errProxyGone marks an exchange that ended with the proxy's connection
// (closed by the proxy, or cut for not answering): a proxy that connects
// again starts from a snapshot of the pods recorded then.
var errProxyGone = errors.New("its connection ended")

// exchange sends one message and waits for its ack; the caller holds pc.send.
func (s *Server) exchange(pc *proxyConn, m Message, netns *os.File) error {
	if err := pc.conn.Send(m, netns); err != nil {
		pc.conn.Close()
		return fmt.Errorf("send %s to the node proxy: %v: %w", m.Type, err, errProxyGone)
	}
	t := time.NewTimer(s.AckTimeout)
	defer t.Stop()
	select {
	case ack := <-pc.acks:
		if ack.Error != "" {
			return fmt.Errorf("%w %s: %s", errNacked, m.Type, ack.Error)
		}
		return nil
	case <-pc.done:
		return fmt.Errorf("node proxy disconnected before acknowledging %s: %w", m.Type, errProxyGone)
	case <-t.C:
		pc.conn.Close()
		return fmt.Errorf("node proxy did not acknowledge %s within %s: %w", m.Type, s.AckTimeout, errProxyGone)
	}
}

// broadcast sends m to every connected proxy and joins their errors; with
// goneIsDone, a proxy whose connection ended is no error.
func (s *Server) broadcast(conns []*proxyConn, m Message, netns *os.File, goneIsDone bool) error {
	var errs []error
	for _, pc := range conns {
		pc.send.Lock()
		err := s.exchange(pc, m, netns)
		pc.send.Unlock()
		if err != nil && !(goneIsDone && errors.Is(err, errProxyGone)) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AddPod records a captured pod and hands it to every connected proxy.
// It takes ownership of netns. It fails, and forgets the pod, when no
// proxy is connected or one refuses it: the pod must not start
// believing it is served.
func (s *Server) AddPod(pod Pod, netns *os.File) error {
	if err := pod.validate(); err != nil {
		netns.Close()
		return err
	}
	conns := s.record(pod, netns)
	err := ErrNoProxy
	if len(conns) > 0 {
		err = s.broadcast(conns, Message{Type: TypeAdd, Pod: &pod}, netns, false)
	}
	if err != nil {
		s.RemovePod(pod.UID)
		return fmt.Errorf("hand %s to the node proxy: %w", pod, err)
	}
	return nil
}

// Restore records a pod captured before the agent (re)started, without
// handing it to anyone: it goes to proxies in their replay. Call it
// before Serve. It takes ownership of netns.
func (s *Server) Restore(pod Pod, netns *os.File) error {
	if err := pod.validate(); err != nil {
		netns.Close()
		return err
	}
	s.record(pod, netns)
	return nil
}

// record keeps the pod (replacing an older namespace of it) and returns
// the proxies connected at that moment.
func (s *Server) record(pod Pod, netns *os.File) []*proxyConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init()
	if old, ok := s.pods[pod.UID]; ok {
		old.netns.Close()
	}
	s.pods[pod.UID] = &captured{pod: pod, netns: netns}
	return s.connsLocked()
}

// RemovePod forgets a pod and tells every connected proxy. A proxy that
// goes away before it acknowledges is no failure (a node proxy restarting,
// or uninstalled, as a pod is deleted): when it connects again, its
// snapshot no longer holds the pod.
func (s *Server) RemovePod(uid string) error {
	s.mu.Lock()
	s.init()
	if p, ok := s.pods[uid]; ok {
		p.netns.Close()
		delete(s.pods, uid)
	}
	conns := s.connsLocked()
	s.mu.Unlock()
	return s.broadcast(conns, Message{Type: TypeRemove, UID: uid}, nil, true)
}

// Has reports whether the pod is recorded as captured.
func (s *Server) Has(uid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pods[uid]
	return ok
}

// Connected is the number of node proxies connected.
func (s *Server) Connected() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *Server) connsLocked() []*proxyConn {
	out := make([]*proxyConn, 0, len(s.conns))
	for pc := range s.conns {
		out = append(out, pc)
	}
	return out
}
