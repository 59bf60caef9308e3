package waypoint

import (
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net/netip"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// TestIngressCertificateHosts: on an HTTPS listener, the key pairs of
// Kubernetes Ingresses (with hosts) serve only their hosts, after the
// listener's own: in real handshakes, a name their certificate is valid
// for but their hosts do not list gets the listener's own certificate; a
// name the listener's own certificate is valid for gets it first; of the
// Ingresses' key pairs, the one whose host covers the name most narrowly
// wins (an exact host over a wildcard listed before it); "*" serves any
// name its certificate is valid for, after them all; a client without SNI
// gets the listener's own; a listener left without its own (it did not
// load) serves no name outside its Ingresses' hosts.
func TestIngressCertificateHosts(t *testing.T) {
	const addr, port = "127.0.76.1", 22443
	f := start(t, func(o *Options) { o.Ingress, o.IngressAddress, o.Policy = true, netip.MustParseAddr(addr), nil })
	ca, err := backendtlstest.NewCA("ingress certificate hosts")
	if err != nil {
		t.Fatal(err)
	}
	leaves := map[string][]byte{} // the DER of each key pair's certificate, by Secret
	keyPair := func(secret string, hosts []string, dns ...string) *meshv1.TLSKeyPair {
		data := ca.SecretData(t, dns...)
		b, _ := pem.Decode(data["tls.crt"])
		if b == nil {
			t.Fatalf("%s: no PEM certificate", secret)
		}
		leaves[secret] = b.Bytes
		return &meshv1.TLSKeyPair{Secret: secret, CertificateChain: data["tls.crt"], PrivateKey: data["tls.key"], Hosts: hosts}
	}
	certs := []*meshv1.TLSKeyPair{
		keyPair("shop/own", nil, "gateway.example.net", "taken.example.com"),
		keyPair("a/wild", []string{"a.example.com", "taken.example.com"}, "*.example.com", "taken.example.com"),
		keyPair("o/wild", []string{"*.example.org"}, "*.example.org"),
		keyPair("o/exact", []string{"c.example.org"}, "c.example.org"),
		keyPair("z/any", []string{"*"}, "z.example.net", "c.example.org"),
	}
	f.w.Update(&xds.State{Set: meshv1.Set{
		IngressGateways: map[string]*meshv1.IngressGateway{"shop/wp": {Namespace: "shop", Name: "wp", Listeners: []*meshv1.IngressListener{
			{Name: "https", Port: port, Protocol: meshv1.IngressListener_HTTPS, Certificates: certs},
			// Its own key pair does not load: only its Ingress's hosts serve.
			{Name: "broken", Port: port + 1, Protocol: meshv1.IngressListener_HTTPS, Certificates: []*meshv1.TLSKeyPair{
				{Secret: "shop/bad", CertificateChain: []byte("not PEM"), PrivateKey: []byte("not PEM")}, certs[1]}},
		}}},
	}})
	handshake := func(port int, sni string) (*tls.Conn, error) {
		conn := testnet.Dial(t, fmt.Sprintf("%s:%d", addr, port))
		// Not verified: the test looks at which certificate is served,
		// including one not valid for the name asked.
		tc := tls.Client(conn, &tls.Config{ServerName: sni, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
		t.Cleanup(func() { tc.Close() })
		return tc, tc.Handshake()
	}
	for _, c := range []struct{ sni, want string }{
		{"a.example.com", "a/wild"},
		{"b.example.com", "shop/own"}, // a/wild's certificate is valid for it, its hosts do not list it
		{"taken.example.com", "shop/own"},
		{"", "shop/own"},
		{"c.example.org", "o/exact"},
		{"d.example.org", "o/wild"},
		{"z.example.net", "z/any"},
	} {
		tc, err := handshake(port, c.sni)
		if err != nil {
			t.Fatalf("SNI %q: %v", c.sni, err)
		}
		got := "another certificate"
		for secret, der := range leaves {
			if bytes.Equal(tc.ConnectionState().PeerCertificates[0].Raw, der) {
				got = secret
			}
		}
		if got != c.want {
			t.Errorf("SNI %q: served the certificate of %s, want %s", c.sni, got, c.want)
		}
	}
	if _, err := handshake(port+1, "a.example.com"); err != nil {
		t.Errorf("the Ingress's host on the listener without its own certificate: %v", err)
	}
	for _, sni := range []string{"b.example.com", ""} {
		if tc, err := handshake(port+1, sni); err == nil {
			t.Errorf("SNI %q on the listener without its own certificate: served %s", sni, tc.ConnectionState().PeerCertificates[0].Subject)
		}
	}
}
