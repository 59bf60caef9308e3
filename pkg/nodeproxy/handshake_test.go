package nodeproxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

// A refused inbound handshake is counted in the proxy's registry (served
// on its metrics port) by reason: here a client without a certificate and
// one whose certificate comes from another CA.
func TestRefusedHandshakesAreCounted(t *testing.T) {
	m, reg, _ := policyMesh(t)
	other := trusttest.NewCA(t, td)
	foreign := other.Certificate(t, trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/c"), 0)
	bID := trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/b")
	for _, cert := range []*tls.Certificate{nil, foreign} {
		var get func() (*tls.Certificate, error)
		if cert != nil {
			get = func() (*tls.Certificate, error) { return cert, nil }
		}
		c, err := net.Dial("tcp", podB+":15008")
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, trust.ClientConfig(m.ca.Bundle, get, []trust.Identity{bID}))
		tc.Handshake()
		tc.Read(make([]byte, 1)) // the server's verdict (TLS 1.3: after the client's Finished)
		tc.Close()
	}
	for reason, want := range map[string]float64{"no_client_certificate": 1, "unknown_authority": 1} {
		waitFor(t, "hbone_handshake_failures_total{reason="+reason+"}", func() error {
			mfs, err := reg.Gather()
			if err != nil {
				return err
			}
			for _, mf := range mfs {
				for _, mt := range mf.GetMetric() {
					if mf.GetName() == "hbone_handshake_failures_total" && mt.GetLabel()[0].GetValue() == reason {
						if got := mt.GetCounter().GetValue(); got != want {
							return fmt.Errorf("%v, want %v", got, want)
						}
						return nil
					}
				}
			}
			return errors.New("not in the registry")
		})
	}
}
