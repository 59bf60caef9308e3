package waypoint

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/l7"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// The ingress role: the listening ports of an ingress Gateway, opened and
// closed as its listeners come and go over xDS, TLS terminated with the
// certificate of the listener the client's server name selects. What
// arrives is routed by l7 (CompileGateway) and forwarded under the
// gateway's own identity (DialEndpoint).

// handshakeTimeout bounds a client's TLS handshake.
const handshakeTimeout = 10 * time.Second

// ingressPorts are the ports the gateway listens on.
type ingressPorts struct {
	w   *Waypoint
	ctx context.Context // ends the connections being served (Shutdown)

	mu     sync.Mutex
	ports  map[uint32]*ingressPort
	closed bool
	conns  sync.WaitGroup
	live   atomic.Int64 // the connections conns waits for
}

// ingressPort is one listening port and the listeners it serves: all HTTP,
// or all HTTPS (the control plane refuses a port whose listeners differ).
type ingressPort struct {
	port  uint32
	https bool
	ln    net.Listener
	// tls are its HTTPS listeners with their parsed key pairs, swapped as
	// certificates change; a handshake reads the current set.
	tls atomic.Pointer[[]tlsListener]
}

// tlsListener is an HTTPS listener's hostname and key pairs.
type tlsListener struct {
	name, hostname string
	certs          []tlsCert
}

// tlsCert is a parsed key pair and the server names it may serve
// (meshv1.TLSKeyPair.hosts; none: any its certificate is valid for).
type tlsCert struct {
	tls.Certificate
	hosts []string
}

func newIngressPorts(ctx context.Context, w *Waypoint) *ingressPorts {
	return &ingressPorts{w: w, ctx: ctx, ports: map[uint32]*ingressPort{}}
}

// update opens the ports of listeners that are new, closes those no
// listener uses any more (their connections finish on the routes in
// force: a request for a listener that is gone gets 404) and gives each
// HTTPS port its listeners' current certificates.
func (p *ingressPorts) update(listeners []*meshv1.IngressListener) {
	byPort := map[uint32][]*meshv1.IngressListener{}
	for _, l := range listeners {
		byPort[l.GetPort()] = append(byPort[l.GetPort()], l)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	log := p.w.log
	for port, ip := range p.ports {
		ls := byPort[port]
		if len(ls) == 0 || (ls[0].GetProtocol() == meshv1.IngressListener_HTTPS) != ip.https {
			ip.ln.Close()
			delete(p.ports, port)
			log.Info("ingress port closed", zap.Uint32("port", port))
		}
	}
	for port, ls := range byPort {
		ip := p.ports[port]
		if ip == nil {
			addr := net.JoinHostPort(p.w.opts.IngressAddress.String(), strconv.Itoa(int(port)))
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				// Retried at the next update; the other ports serve.
				log.Error("ingress port cannot be opened", zap.String("address", addr), zap.Error(err))
				continue
			}
			ip = &ingressPort{port: port, https: ls[0].GetProtocol() == meshv1.IngressListener_HTTPS, ln: ln}
			ip.setListeners(ls, log)
			p.ports[port] = ip
			go p.accept(ip)
			log.Info("ingress port opened", zap.String("address", ln.Addr().String()), zap.Bool("https", ip.https))
			continue
		}
		ip.setListeners(ls, log)
	}
}

// setListeners gives an HTTPS port its listeners' current key pairs.
func (ip *ingressPort) setListeners(ls []*meshv1.IngressListener, log *zap.Logger) {
	if ip.https {
		tl := tlsListeners(ls, log)
		ip.tls.Store(&tl)
	}
}

// tlsListeners parses the key pairs of HTTPS listeners. One that does not
// parse is left out (logged by its Secret, never its content); a listener
// left without any is not served.
func tlsListeners(ls []*meshv1.IngressListener, log *zap.Logger) []tlsListener {
	var out []tlsListener
	for _, l := range ls {
		tl := tlsListener{name: l.GetName(), hostname: l.GetHostname()}
		for _, kp := range l.GetCertificates() {
			c, err := tls.X509KeyPair(kp.GetCertificateChain(), kp.GetPrivateKey())
			if err != nil {
				log.Error("ingress listener certificate does not load; left out", zap.String("listener", l.GetName()), zap.String("secret", kp.GetSecret()), zap.Error(err))
				continue
			}
			tl.certs = append(tl.certs, tlsCert{Certificate: c, hosts: kp.GetHosts()})
		}
		if len(tl.certs) > 0 {
			out = append(out, tl)
		}
	}
	return out
}

// certificate is the HTTPS listener of ls that serves server name sni
// (meshv1.HostRank: a client without SNI gets the listener without a
// hostname) and its key pair for sni (meshv1.IngressListener.certificates
// gives the precedence): the first of its own (without hosts) valid for
// sni; else, of those whose hosts cover sni and valid for it, the one
// covering it most narrowly (the first of equals); else its first own. A
// key pair with hosts never serves a name outside them: a Kubernetes
// Ingress's certificate serves only the hosts its tls entry names.
func certificate(ls []tlsListener, sni string) (string, *tls.Certificate, error) {
	best, bestRank := -1, -1
	for i, l := range ls {
		if r := meshv1.HostRank(l.hostname, sni); r > bestRank {
			best, bestRank = i, r
		}
	}
	if best < 0 {
		return "", nil, fmt.Errorf("no listener serves server name %q", sni)
	}
	l := ls[best]
	var own, named *tls.Certificate
	namedRank := -1
	for i := range l.certs {
		c := &l.certs[i]
		if own == nil && len(c.hosts) == 0 {
			own = &c.Certificate
		}
		if sni == "" || c.Leaf == nil || c.Leaf.VerifyHostname(sni) != nil {
			continue
		}
		if len(c.hosts) == 0 {
			return l.name, &c.Certificate, nil
		}
		if r := hostsRank(c.hosts, sni); r > namedRank {
			named, namedRank = &c.Certificate, r
		}
	}
	switch {
	case named != nil:
		return l.name, named, nil
	case own != nil:
		return l.name, own, nil
	}
	return l.name, nil, fmt.Errorf("listener %s has no certificate for server name %q", l.name, sni)
}

// hostsRank says how narrowly a key pair's hosts cover server name sni:
// -1 not at all, 0 for "*" (any name), else the best meshv1.HostRank.
func hostsRank(hosts []string, sni string) int {
	rank := -1
	for _, h := range hosts {
		r := 0
		if h != "*" {
			r = meshv1.HostRank(h, sni)
		}
		rank = max(rank, r)
	}
	return rank
}

func (p *ingressPorts) accept(ip *ingressPort) {
	for {
		c, err := ip.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.conns.Add(1)
		p.live.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.conns.Done()
			defer p.live.Add(-1)
			p.serve(ip, c)
		}()
	}
}

// serve terminates TLS on an HTTPS port and hands the connection to l7.
func (p *ingressPorts) serve(ip *ingressPort, c net.Conn) {
	info := l7.ConnInfo{Peer: trust.Unauthenticated(), Source: addrPort(c.RemoteAddr()), Destination: addrPort(c.LocalAddr()),
		Port: ip.port, Protocol: l7.ProtocolHTTP, Ingress: true}
	conn := c
	if ip.https {
		ls := *ip.tls.Load()
		var chosen string
		tc := tls.Server(c, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2", "http/1.1"},
			GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
				name, cert, err := certificate(ls, hello.ServerName)
				chosen = name
				return cert, err
			},
		})
		ctx, cancel := context.WithTimeout(p.ctx, handshakeTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			p.w.access.Info("connection", zap.String("src", info.Source.String()), zap.Uint32("port", ip.port),
				zap.String("result", "TLS handshake refused: "+err.Error()))
			c.Close()
			return
		}
		info.Listener, info.TLS = chosen, true
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			info.Protocol = l7.ProtocolHTTP2
		}
		conn = tc
	}
	if err := p.w.engine.ServeConn(p.ctx, conn, info); err != nil {
		p.w.log.Debug("ingress connection ended", zap.Stringer("src", info.Source), zap.Error(err))
	}
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	return netip.AddrPort{}
}

// shutdown closes the ports and waits for their connections until ctx
// ends (the engine drains them); the waypoint's stop then ends the rest.
func (p *ingressPorts) shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	for port, ip := range p.ports {
		ip.ln.Close()
		delete(p.ports, port)
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		p.conns.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		p.w.log.Warn("drain deadline: cutting the ingress connections left", zap.Int64("connections", p.live.Load()))
		return ctx.Err()
	}
}
