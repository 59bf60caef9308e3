// Package inpod is the node proxy's in-pod mode (ztunnel's model): for each
// pod the node agent hands over, the proxy opens its listeners inside the
// pod's network namespace, where the pod's rules redirect its traffic:
// outbound (15001, original destination from SO_ORIGINAL_DST), inbound
// plaintext (15006) and HBONE (15008). Connections it opens for a pod
// leave from inside the pod's namespace, so they carry the pod's IP, and
// are marked so that the rules let them through.
package inpod

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/capture"
	"github.com/causeway-mesh/causeway/pkg/capture/handoff"
	"github.com/causeway-mesh/causeway/pkg/capture/podns"
	"github.com/causeway-mesh/causeway/pkg/capture/rules"
	"github.com/causeway-mesh/causeway/pkg/hbone"
)

// Proxy is what takes the connections of captured pods.
type Proxy interface {
	capture.Handler
	capture.InboundHandler
	// ServeHBONE serves HBONE on ln until ln is closed or the proxy
	// drains (hbone.ErrServerClosed).
	ServeHBONE(ln net.Listener) error
	// DrainInbound stops taking HBONE tunnels: each connection gets a
	// GOAWAY (new tunnels go to another listener: the new node proxy's)
	// and those in flight finish, until ctx ends.
	DrainInbound(ctx context.Context)
	// PodGone says a pod left: what the proxy dialled from its addresses
	// (pooled tunnels) is to be closed.
	PodGone(ips []netip.Addr)
	// WaitOutbound waits until the outbound connections it relays have
	// ended, or ctx ends. Their relays hold no goroutine of the pod's
	// (HandleOutbound returns once a relay is started), so the drain
	// asks the proxy.
	WaitOutbound(ctx context.Context)
}

// Options configure a Manager; zero values take the defaults of docs/design.md §2.
type Options struct {
	OutboundPort, InboundPort, HBONEPort uint16
	// Mark is set on every socket the proxy opens in a pod (default 0x539).
	Mark   uint32
	Logger *zap.Logger
}

// Manager serves the pods handed to the node proxy (a handoff.PodHandler)
// and dials from inside them. Close stops every pod.
type Manager struct {
	proxy Proxy
	opts  Options
	sock  sockets
	log   *zap.Logger

	mu   sync.Mutex
	pods map[string]*pod // by uid
	byIP map[netip.Addr]*pod
}

var _ handoff.PodHandler = (*Manager)(nil)

// pod is one served pod. Its context ends when it is removed, which ends
// its relayed connections; conns are the HBONE connections, closed then.
type pod struct {
	info handoff.Pod
	ips  []netip.Addr
	// nsMu guards netns: dials use it under the read lock, and it is
	// closed (nil) under the write lock once the pod is gone.
	nsMu      sync.RWMutex
	netns     ns.NetNS
	ctx       context.Context
	cancel    context.CancelFunc
	listeners []net.Listener
	wg        sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
}

// NewManager serves pods for proxy.
func NewManager(proxy Proxy, o Options) *Manager {
	// The listeners take what the pod's rules redirect: the same defaults.
	d := rules.Config{OutboundPort: o.OutboundPort, InboundPort: o.InboundPort, HBONEPort: o.HBONEPort, Mark: o.Mark}.Defaults()
	o.OutboundPort, o.InboundPort, o.HBONEPort, o.Mark = d.OutboundPort, d.InboundPort, d.HBONEPort, d.Mark
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return &Manager{proxy: proxy, opts: o, sock: sockets{mark: o.Mark}, log: o.Logger,
		pods: map[string]*pod{}, byIP: map[netip.Addr]*pod{}}
}

// AddPod opens the pod's listeners inside netns and starts serving them.
// It takes ownership of netns.
func (m *Manager) AddPod(_ context.Context, info handoff.Pod, netns *os.File) error {
	// GetNS checks that the descriptor is a network namespace.
	nsh, err := ns.GetNS(fmt.Sprintf("/proc/self/fd/%d", netns.Fd()))
	netns.Close()
	if err != nil {
		return fmt.Errorf("pod %s: %w", info, err)
	}
	p, err := m.open(info, nsh)
	if err != nil {
		nsh.Close()
		return fmt.Errorf("pod %s: %w", info, err)
	}
	m.mu.Lock()
	old := m.pods[info.UID]
	if old != nil {
		m.removeLocked(old)
	}
	m.pods[info.UID] = p
	for _, ip := range p.ips {
		m.byIP[ip] = p
	}
	m.mu.Unlock()
	if old != nil {
		m.proxy.PodGone(old.ips)
		old.releaseNetns()
	}
	p.serve(m)
	m.log.Info("serving pod in its network namespace", zap.Stringer("pod", info), zap.Any("ips", p.ips))
	return nil
}

func (m *Manager) open(info handoff.Pod, nsh ns.NetNS) (*pod, error) {
	ips, err := podns.Addresses(nsh)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	if len(ips) == 0 {
		return nil, errors.New("the network namespace has no pod address")
	}
	if err := migrateRequests(nsh); err != nil {
		// Expected for a pod captured without the CNI plugin (running before
		// its namespace was enrolled) under the shipped DaemonSet.
		m.log.Debug("connections queued at a closing listener will be reset", zap.Stringer("pod", info), zap.Error(err))
	}
	p := &pod{info: info, netns: nsh, ips: ips, conns: map[net.Conn]struct{}{}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for _, port := range []uint16{m.opts.OutboundPort, m.opts.InboundPort, m.opts.HBONEPort} {
		ln, err := m.sock.listen(nsh, port)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("listen on %d: %w", port, err)
		}
		p.listeners = append(p.listeners, ln)
	}
	return p, nil
}

func (p *pod) serve(m *Manager) {
	out, in, tunnels := p.listeners[0], p.listeners[1], p.listeners[2]
	p.wg.Add(3)
	go func() {
		defer p.wg.Done()
		p.accept(m, out, func(c *net.TCPConn, dst netip.AddrPort) {
			src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			m.proxy.HandleOutbound(p.ctx, &outboundConn{TCPConn: c, src: unmap(src), dst: dst, uid: p.info.UID})
		})
	}()
	go func() {
		defer p.wg.Done()
		p.accept(m, in, func(c *net.TCPConn, dst netip.AddrPort) {
			if !slices.Contains(p.ips, dst.Addr().Unmap()) {
				m.log.Warn("inbound connection for another address", zap.Stringer("pod", p.info), zap.Stringer("dst", dst))
				abort(c)
				return
			}
			m.proxy.HandleInbound(p.ctx, c, dst)
		})
	}()
	go func() {
		defer p.wg.Done()
		err := m.proxy.ServeHBONE(&trackingListener{Listener: tunnels, pod: p})
		if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, hbone.ErrServerClosed) && p.ctx.Err() == nil {
			m.log.Error("HBONE listener stopped", zap.Stringer("pod", p.info), zap.Error(err))
		}
	}()
}

// accept hands each redirected connection, with its original destination,
// to handle on its own goroutine; handle owns it.
func (p *pod) accept(m *Manager, ln net.Listener, handle func(*net.TCPConn, netip.AddrPort)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				m.log.Error("in-pod listener stopped", zap.Stringer("pod", p.info), zap.Stringer("addr", ln.Addr()), zap.Error(err))
			}
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			tc := c.(*net.TCPConn)
			dst, err := originalDestination(tc)
			if err != nil {
				m.log.Warn("redirected connection without a destination", zap.Stringer("pod", p.info), zap.Stringer("addr", ln.Addr()), zap.Error(err))
				abort(tc)
				return
			}
			handle(tc, unmap(dst))
		}()
	}
}

// RemovePod closes the pod's listeners and connections.
func (m *Manager) RemovePod(uid string) {
	m.mu.Lock()
	p := m.pods[uid]
	if p != nil {
		m.removeLocked(p)
	}
	m.mu.Unlock()
	if p != nil {
		m.proxy.PodGone(p.ips)
		p.releaseNetns()
		p.wg.Wait()
		m.log.Info("stopped serving pod", zap.Stringer("pod", p.info))
	}
}

func (m *Manager) removeLocked(p *pod) {
	delete(m.pods, p.info.UID)
	for _, ip := range p.ips {
		if m.byIP[ip] == p {
			delete(m.byIP, ip)
		}
	}
	p.close()
}

// close ends everything of the pod; its goroutines finish on their own.
func (p *pod) close() {
	p.cancel()
	for _, ln := range p.listeners {
		ln.Close()
	}
	p.mu.Lock()
	p.done = true
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.Close() // untracks itself
	}
}

// releaseNetns closes the namespace once no dial uses it.
func (p *pod) releaseNetns() {
	p.nsMu.Lock()
	defer p.nsMu.Unlock()
	if p.netns != nil {
		p.netns.Close()
		p.netns = nil
	}
}

// Shutdown stops accepting in every pod and gives the connections in
// flight until ctx ends to finish, then closes everything. With another
// node proxy listening beside this one, new connections go to it meanwhile,
// and so do new tunnels of peers whose HBONE connections this one accepted
// (they get a GOAWAY at once: until ctx ends they would otherwise keep
// opening tunnels on them, to be cut when it does).
func (m *Manager) Shutdown(ctx context.Context) {
	m.mu.Lock()
	pods := make([]*pod, 0, len(m.pods))
	for _, p := range m.pods {
		pods = append(pods, p)
	}
	m.mu.Unlock()
	for _, p := range pods {
		for _, ln := range p.listeners {
			ln.Close()
		}
	}
	inbound := make(chan struct{})
	go func() {
		m.proxy.DrainInbound(ctx)
		close(inbound)
	}()
	done := make(chan struct{})
	go func() {
		for _, p := range pods {
			p.wg.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
		// No connection is being accepted or connected any more: what is
		// left is relayed, until it ends or the drain does.
		m.proxy.WaitOutbound(ctx)
	case <-ctx.Done():
	}
	<-inbound // ends with ctx at the latest
	m.Close()
}

// Close stops serving every pod.
func (m *Manager) Close() {
	m.mu.Lock()
	uids := make([]string, 0, len(m.pods))
	for uid := range m.pods {
		uids = append(uids, uid)
	}
	m.mu.Unlock()
	for _, uid := range uids {
		m.RemovePod(uid)
	}
}

// Dial opens a connection for the proxy. From a served pod's address it
// dials inside that pod's namespace (so the peer sees the pod's IP, and
// the pod's rules let the marked socket out); from anywhere else it dials
// from the proxy's own namespace.
func (m *Manager) Dial(ctx context.Context, local netip.Addr, remote netip.AddrPort) (net.Conn, error) {
	m.mu.Lock()
	p := m.byIP[local.Unmap()]
	m.mu.Unlock()
	if p == nil {
		var d net.Dialer
		if local.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))
		}
		return d.DialContext(ctx, "tcp", remote.String())
	}
	p.nsMu.RLock()
	defer p.nsMu.RUnlock()
	if p.netns == nil {
		return nil, fmt.Errorf("pod %s is gone", p.info)
	}
	return m.sock.dial(ctx, p.netns, local, remote)
}

// trackingListener records a pod's HBONE connections so that removing
// the pod closes them.
type trackingListener struct {
	net.Listener
	pod *pod
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	p := l.pod
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, pod: p}
	p.conns[tc] = struct{}{}
	return tc, nil
}

type trackedConn struct {
	net.Conn
	pod  *pod
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.pod.mu.Lock()
		delete(c.pod.conns, c)
		c.pod.mu.Unlock()
	})
	return c.Conn.Close()
}

// outboundConn is a redirected outbound connection (capture.Conn). There
// is nothing to answer: the application believes it is connected, so any
// outcome but Connected resets the connection.
type outboundConn struct {
	*net.TCPConn
	src netip.AddrPort
	dst netip.AddrPort
	uid string
}

func (c *outboundConn) Source() netip.AddrPort           { return c.src }
func (c *outboundConn) Destination() capture.Destination { return capture.Destination{Addr: c.dst} }
func (c *outboundConn) NetConn() net.Conn                { return c.TCPConn }

// PodUID is the uid of the pod whose namespace the connection came from:
// the source workload, whatever address it used.
func (c *outboundConn) PodUID() string { return c.uid }

func (c *outboundConn) Answer(o capture.Outcome) error {
	if o != capture.Connected {
		c.SetLinger(0)
	}
	return nil
}

func abort(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// Pods lists the uids of the pods served.
func (m *Manager) Pods() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.pods))
}
