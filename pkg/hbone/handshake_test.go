package hbone

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/internal/metricstest"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

// handshakeFailureCounts gathers hbone_handshake_failures_total by reason.
func handshakeFailureCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	return metricstest.ByLabel(t, reg, "hbone_handshake_failures_total", "reason")
}

// TestHandshakeFailureReasons: every way an inbound handshake is refused,
// with real TLS over loopback, is counted once under its own reason and
// under no other.
func TestHandshakeFailureReasons(t *testing.T) {
	m := newMesh(t)
	other := trusttest.NewCA(t, td)
	elsewhere := m.ca.Certificate(t, trusttest.Identity(t, "spiffe://other.local/ns/src/sa/client"), 0)
	shortLived := m.ca.Certificate(t, m.clientID, time.Hour)

	// A client as the pool's, with cert (nil: TLS-only) and the server it
	// expects.
	hbone := func(cert *tls.Certificate, expect trust.Identity) func(net.Conn) {
		var get func() (*tls.Certificate, error)
		if cert != nil {
			get = func() (*tls.Certificate, error) { return cert, nil }
		}
		return func(c net.Conn) {
			tls.Client(c, trust.ClientConfig(m.ca.Bundle, get, []trust.Identity{expect})).Handshake()
		}
	}
	// A client with a TLS configuration of its own (not an HBONE client).
	plainTLS := func(edit func(*tls.Config)) func(net.Conn) {
		return func(c net.Conn) {
			cfg := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{*m.clientCert}}
			edit(cfg)
			tls.Client(c, cfg).Handshake()
		}
	}
	for _, tc := range []struct {
		name   string
		want   string
		auth   trust.ClientAuth
		offset time.Duration // of the server's clock
		noCert bool          // the server has no certificate to present
		client func(net.Conn)
	}{
		{name: "no certificate, one required", want: FailNoClientCertificate, auth: trust.RequireClientCert, client: hbone(nil, m.serverID)},
		{name: "expired by the server's clock", want: FailExpired, offset: 2 * time.Hour, client: hbone(shortLived, m.serverID)},
		{name: "not yet valid by the server's clock (behind)", want: FailNotYetValid, offset: -time.Hour, client: hbone(m.clientCert, m.serverID)},
		{name: "another CA", want: FailUnknownAuthority, client: hbone(other.Certificate(t, m.clientID, 0), m.serverID)},
		{name: "another trust domain", want: FailBadCertificate, client: hbone(elsewhere, m.serverID)},
		{name: "the client refuses the server's identity", want: FailPeerRefused,
			client: hbone(m.clientCert, trusttest.Identity(t, "spiffe://"+td+"/ns/dst/sa/someone-else"))},
		{name: "not TLS", want: FailProtocol, client: func(c net.Conn) { c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")) }},
		{name: "TLS 1.2", want: FailProtocol, client: plainTLS(func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 })},
		{name: "ALPN http/1.1", want: FailProtocol, client: plainTLS(func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })},
		{name: "no ALPN", want: FailProtocol, client: plainTLS(func(*tls.Config) {})},
		{name: "no server certificate", want: FailNoServerCertificate, noCert: true, client: hbone(m.clientCert, m.serverID)},
		{name: "silent client", want: FailTimeout, client: func(c net.Conn) { time.Sleep(time.Second) }},
		{name: "client hangs up", want: FailPeerClosed, client: func(net.Conn) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The server judges by a bundle of its own (same roots), so
			// that its clock can differ from the client's.
			b, err := trust.NewBundle(td, m.ca.Bundle.Roots())
			if err != nil {
				t.Fatal(err)
			}
			b.SetClock(func() time.Time { return time.Now().Add(tc.offset) })
			certFor := func(net.Addr) (*tls.Certificate, error) {
				if tc.noCert {
					return nil, errors.New("not issued yet")
				}
				return m.serverCert, nil
			}
			reg := prometheus.NewRegistry()
			_, addr := startServer(t, m, &dialHandler{}, func(o *ServerOptions) {
				o.TLS, o.Registerer, o.HandshakeTimeout = trust.ServerConfig(b, certFor, tc.auth), reg, 200*time.Millisecond
			})
			c, err := net.Dial("tcp", addr.String())
			if err != nil {
				t.Fatal(err)
			}
			tc.client(c)
			c.Close()
			var got map[string]float64
			eventually(t, 5*time.Second, "the refusal counted", func() bool {
				got = handshakeFailureCounts(t, reg)
				total := 0.0
				for _, v := range got {
					total += v
				}
				return total > 0
			})
			time.Sleep(50 * time.Millisecond) // nothing else follows
			got = handshakeFailureCounts(t, reg)
			for _, r := range handshakeFailures {
				want := 0.0
				if r == tc.want {
					want = 1
				}
				if got[r] != want {
					t.Errorf("hbone_handshake_failures_total{reason=%q} = %v, want %v (all: %v)", r, got[r], want, got)
				}
			}
		})
	}

	// A good client is not counted.
	reg := prometheus.NewRegistry()
	_, addr := startServer(t, m, &dialHandler{}, func(o *ServerOptions) { o.Registerer = reg })
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, trust.ClientConfig(m.ca.Bundle, func() (*tls.Certificate, error) { return m.clientCert, nil }, []trust.Identity{m.serverID}))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	for r, v := range handshakeFailureCounts(t, reg) {
		if v != 0 {
			t.Errorf("after a good handshake hbone_handshake_failures_total{reason=%q} = %v", r, v)
		}
	}
	tc.Close()
}
