package trust_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

func signWorkload(t *testing.T, a *trust.Authority, id string) []*x509.Certificate {
	t.Helper()
	ident := trusttest.Identity(t, id)
	_, csrPEM, err := trust.NewKeyAndCSR(ident)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := a.Sign(csr, ident, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var all string
	for _, c := range chain {
		all += c
	}
	certs, err := trust.ParseCertificatesPEM([]byte(all))
	if err != nil {
		t.Fatal(err)
	}
	return certs
}

// verifies checks that a signed chain (leaf first, root last) verifies
// against roots.
func verifies(t *testing.T, certs []*x509.Certificate, roots []*x509.Certificate) {
	t.Helper()
	rp := x509.NewCertPool()
	for _, r := range roots {
		rp.AddCert(r)
	}
	ip := x509.NewCertPool()
	for _, c := range certs[1:] {
		ip.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: rp, Intermediates: ip, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("issued chain does not verify: %v", err)
	}
}

func TestLoadOrCreateCAGenerates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cacerts")
	a, err := trust.LoadOrCreateCA(dir, "cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if a.MaxTTL() != time.Hour {
		t.Fatalf("max TTL %s", a.MaxTTL())
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("directory mode %v, want 0700", fi.Mode().Perm())
	}
	for _, f := range []string{trust.CACertFile, trust.CAKeyFile, trust.RootCertFile, trust.CertChainFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 4 {
		t.Fatalf("directory holds %d entries, want exactly the 4 CA files", len(entries))
	}
	certs := signWorkload(t, a, "spiffe://cluster.local/ns/a/sa/b")
	verifies(t, certs, a.Roots())
	if got, err := trust.ParseCertificatesPEM(a.RootsPEM()); err != nil || len(got) != 1 || !got[0].Equal(a.Roots()[0]) {
		t.Fatalf("RootsPEM: %v", err)
	}

	// A second start loads the same CA instead of generating a new one.
	b, err := trust.LoadOrCreateCA(dir, "cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Roots()[0].Equal(a.Roots()[0]) {
		t.Fatal("second start generated a new root")
	}
	verifies(t, signWorkload(t, b, "spiffe://cluster.local/ns/a/sa/b"), a.Roots())
}

func TestLoadOrCreateCAConcurrentStarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cacerts")
	const n = 4
	auths := make([]*trust.Authority, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { auths[i], errs[i] = trust.LoadOrCreateCA(dir, "cluster.local", 0) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("start %d: %v", i, errs[i])
		}
		if !auths[i].Roots()[0].Equal(auths[0].Roots()[0]) {
			t.Fatalf("start %d uses a different root", i)
		}
	}
}

func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

func TestLoadOrCreateCABadDirectories(t *testing.T) {
	good := t.TempDir()
	if _, err := trust.LoadOrCreateCA(good, "cluster.local", 0); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if _, err := trust.LoadOrCreateCA(other, "cluster.local", 0); err != nil {
		t.Fatal(err)
	}

	t.Run("partial", func(t *testing.T) {
		dir := copyDir(t, good)
		os.Remove(filepath.Join(dir, trust.CertChainFile))
		os.Remove(filepath.Join(dir, trust.RootCertFile))
		_, err := trust.LoadOrCreateCA(dir, "cluster.local", 0)
		wantErr(t, "partial", err, "is incomplete: missing cert-chain.pem, root-cert.pem")
		if _, err := os.Stat(filepath.Join(dir, trust.RootCertFile)); err == nil {
			t.Fatal("a partial directory was filled in")
		}
	})
	t.Run("key of another CA", func(t *testing.T) {
		dir := copyDir(t, good)
		data, _ := os.ReadFile(filepath.Join(other, trust.CAKeyFile))
		os.WriteFile(filepath.Join(dir, trust.CAKeyFile), data, 0o600)
		_, err := trust.LoadOrCreateCA(dir, "cluster.local", 0)
		wantErr(t, "mismatched key", err, "signing key does not match the signing certificate")
	})
	t.Run("root of another CA", func(t *testing.T) {
		dir := copyDir(t, good)
		data, _ := os.ReadFile(filepath.Join(other, trust.RootCertFile))
		os.WriteFile(filepath.Join(dir, trust.RootCertFile), data, 0o600)
		_, err := trust.LoadOrCreateCA(dir, "cluster.local", 0)
		wantErr(t, "mismatched root", err, "signing certificate does not chain to the roots")
	})
	t.Run("garbage key", func(t *testing.T) {
		dir := copyDir(t, good)
		os.WriteFile(filepath.Join(dir, trust.CAKeyFile), []byte("not a key"), 0o600)
		_, err := trust.LoadOrCreateCA(dir, "cluster.local", 0)
		wantErr(t, "garbage key", err, "ca-key.pem: no PEM private key found")
	})
	t.Run("two signing certificates", func(t *testing.T) {
		dir := copyDir(t, good)
		data, _ := os.ReadFile(filepath.Join(dir, trust.CertChainFile))
		os.WriteFile(filepath.Join(dir, trust.CACertFile), data, 0o600)
		_, err := trust.LoadOrCreateCA(dir, "cluster.local", 0)
		wantErr(t, "ca-cert with two certificates", err, "ca-cert.pem: want exactly one certificate, found 2")
	})
	t.Run("bad trust domain", func(t *testing.T) {
		_, err := trust.LoadOrCreateCA(t.TempDir(), "Not A Domain", 0)
		wantErr(t, "trust domain", err, `trust domain "Not A Domain"`)
	})
}

// TestLoadOperatorCA loads a CA an operator made elsewhere: an RSA root, an
// RSA intermediate and an ECDSA signing CA below it, with cert-chain.pem
// carrying both ends of the chain as Istio's tooling writes it.
func TestLoadOperatorCA(t *testing.T) {
	rootKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	root := makeCA(t, "root", &rootKey.PublicKey, nil, rootKey)
	interKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	inter := makeCA(t, "intermediate", &interKey.PublicKey, root, rootKey)
	caKey := p256(t)
	caCert := makeCA(t, "cluster CA", &caKey.PublicKey, inter, interKey)

	dir := t.TempDir()
	enc := func(certs ...*x509.Certificate) []byte {
		var out []byte
		for _, c := range certs {
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
		return out
	}
	keyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, trust.CACertFile), enc(caCert), 0o600)
	os.WriteFile(filepath.Join(dir, trust.CAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	os.WriteFile(filepath.Join(dir, trust.RootCertFile), enc(root), 0o600)
	os.WriteFile(filepath.Join(dir, trust.CertChainFile), enc(caCert, inter, root), 0o600)

	a, err := trust.LoadOrCreateCA(dir, "cluster.local", 0)
	if err != nil {
		t.Fatal(err)
	}
	certs := signWorkload(t, a, "spiffe://cluster.local/ns/a/sa/b")
	if len(certs) != 4 || !certs[1].Equal(caCert) || !certs[2].Equal(inter) || !certs[3].Equal(root) {
		t.Fatalf("issued chain has %d elements, want leaf, cluster CA, intermediate, root", len(certs))
	}
	verifies(t, certs, []*x509.Certificate{root})

	// cert-chain.pem with only the intermediate works too.
	os.WriteFile(filepath.Join(dir, trust.CertChainFile), enc(inter), 0o600)
	if _, err := trust.LoadCA(dir, 0); err != nil {
		t.Fatal(err)
	}
	// Without the intermediate the signing CA does not reach the root.
	os.WriteFile(filepath.Join(dir, trust.CertChainFile), enc(caCert, root), 0o600)
	_, err = trust.LoadCA(dir, 0)
	wantErr(t, "chain missing its intermediate", err, "does not chain to the roots")
}

func makeCA(t *testing.T, name string, pub crypto.PublicKey, parent *x509.Certificate, parentKey crypto.Signer) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestLoadBundleFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := trust.LoadOrCreateCA(dir, "cluster.local", time.Hour); err != nil {
		t.Fatal(err)
	}
	b, err := trust.LoadBundleFile("cluster.local", filepath.Join(dir, trust.RootCertFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Roots()) != 1 || !b.Roots()[0].IsCA {
		t.Fatalf("roots = %v", b.Roots())
	}
	notPEM := filepath.Join(dir, "junk.pem")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	for _, p := range []string{notPEM, filepath.Join(dir, "missing.pem")} {
		if _, err := trust.LoadBundleFile("cluster.local", p); err == nil {
			t.Errorf("trust.LoadBundleFile(%s) succeeded", p)
		}
	}
}
