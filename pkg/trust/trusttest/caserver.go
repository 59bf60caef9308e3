package trusttest

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/caserver"
)

// CAServer is the CA gRPC service running on 127.0.0.1 over TLS, presenting
// the control plane identity, as the control plane serves it on 15012.
type CAServer struct {
	// Addr is the listening address; it stays the same across Restart.
	Addr string
	// Identity is the identity the server presents.
	Identity trust.Identity
	// Service is the CA service.
	Service *caserver.Server

	t      testing.TB
	ca     *CA
	cert   *tls.Certificate
	mu     sync.Mutex
	server *grpc.Server
	done   chan struct{}
}

// StartCAServer serves a CA service built from opts (Authority and
// TrustDomain default to the test CA's) on 127.0.0.1. The server verifies
// client certificates when given, so mesh-certificate callers work. It is
// stopped when the test ends.
func (c *CA) StartCAServer(t testing.TB, opts caserver.Options) *CAServer {
	t.Helper()
	if opts.Authority == nil {
		opts.Authority = c.Authority
	}
	if opts.TrustDomain == "" {
		opts.TrustDomain = c.Bundle.TrustDomain().Name()
	}
	svc, err := caserver.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	id, err := trust.ControlPlaneIdentity(opts.TrustDomain)
	if err != nil {
		t.Fatal(err)
	}
	s := &CAServer{Identity: id, Service: svc, t: t, ca: c, cert: c.Certificate(t, id, 0)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(s.Stop)
	return s
}

func (s *CAServer) serve(ln net.Listener) {
	cfg := trust.ServerConfig(s.ca.Bundle, func(net.Addr) (*tls.Certificate, error) { return s.cert, nil }, trust.VerifyIfGiven)
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	s.Service.Register(g)
	done := make(chan struct{})
	s.mu.Lock()
	s.server, s.done = g, done
	s.mu.Unlock()
	go func() {
		defer close(done)
		if err := g.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.t.Errorf("CA server: %v", err)
		}
	}()
}

// Stop stops the server (open connections are closed); calls fail until Restart.
func (s *CAServer) Stop() {
	s.mu.Lock()
	g, done := s.server, s.done
	s.server = nil
	s.mu.Unlock()
	if g != nil {
		g.Stop()
		<-done
	}
}

// Restart serves again on the same address.
func (s *CAServer) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	s.serve(ln)
}
