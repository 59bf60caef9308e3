package trust

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"testing"
)

func FuzzParseIdentity(f *testing.F) {
	for _, s := range []string{
		"spiffe://cluster.local/ns/default/sa/default",
		"spiffe://cluster.local/ns/a/sa/b/c",
		"spiffe://cluster.local/ns//sa/b",
		"spiffe://Cluster.local/ns/a/sa/b",
		"spiffe://cluster.local/ns/a/sa/b?x=1",
		"spiffe://cluster.local/ns/../sa/b",
		"spiffe://td/ns/a/sa/%41",
		"https://cluster.local/ns/a/sa/b",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseIdentity(s)
		if err != nil {
			if !id.IsZero() {
				t.Fatalf("error %v with a non-zero identity", err)
			}
			return
		}
		if id.String() != s {
			t.Fatalf("ParseIdentity(%q).String() = %q", s, id.String())
		}
		if id.Namespace() == "" || id.ServiceAccount() == "" {
			t.Fatalf("%q: empty namespace or service account", s)
		}
		again, err := NewIdentity(id.TrustDomain().Name(), id.Namespace(), id.ServiceAccount())
		if err != nil || again != id {
			t.Fatalf("NewIdentity from the parts of %q = %v, %v", s, again, err)
		}
		if u, err := IdentityFromURL(id.URL()); err != nil || u != id {
			t.Fatalf("URL round trip of %q = %v, %v", s, u, err)
		}
	})
}

func FuzzParseCSR(f *testing.F) {
	want, err := ParseIdentity("spiffe://cluster.local/ns/a/sa/b")
	if err != nil {
		f.Fatal(err)
	}
	_, good, err := NewKeyAndCSR(want)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	two, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{
		want.URL(), {Scheme: "spiffe", Host: "cluster.local", Path: "/ns/a/sa/c"},
	}}, key)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: two}))
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: two[:len(two)/2]}))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		csr, err := ParseCSR(data)
		if err != nil {
			return
		}
		if err := CheckCSR(csr, want); err != nil {
			return
		}
		// Accepted: it must ask for exactly the identity, with a P-256 key.
		if len(csr.URIs) != 1 || csr.URIs[0].String() != want.String() {
			t.Fatalf("CheckCSR accepted SANs %v for %s", csr.URIs, want)
		}
		if pub, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
			t.Fatalf("CheckCSR accepted key %T", csr.PublicKey)
		}
	})
}

func FuzzParsePEM(f *testing.F) {
	m, err := GenerateSelfSigned("cluster.local", DefaultRootTTL)
	if err != nil {
		f.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(m.Key)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(encodeCert(m.Chain[0].Raw) + encodeCert(m.Roots[0].Raw)))
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	f.Add(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: []byte{0x30, 0x00}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		if certs, err := ParseCertificatesPEM(data); err == nil && len(certs) == 0 {
			t.Fatal("no certificates and no error")
		}
		if k, err := parsePrivateKeyPEM(data); err == nil && k == nil {
			t.Fatal("nil key and no error")
		}
	})
}
