package main

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

func TestCertificatesTable(t *testing.T) {
	ca := trusttest.NewCA(t, "cluster.local")
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/reviews")
	cert := ca.Certificate(t, id, time.Hour)
	inter, err := x509.ParseCertificate(cert.Certificate[1])
	if err != nil {
		t.Fatal(err)
	}
	root := ca.Bundle.Roots()[0]
	c := statusOf(id.String(), cert.Leaf, inter, root)
	broken := certmanager.CertificateStatus{Identity: "spiffe://cluster.local/ns/shop/sa/ratings", State: "Unavailable: no workload with identity X on node node-a"}

	var out bytes.Buffer
	if err := writeCertificates(&out, []certmanager.CertificateStatus{c, broken}, time.Now()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("want header + 4 rows, got:\n%s", out.String())
	}
	wantFields := [][]string{
		{"CERTIFICATE", "NAME", "TYPE", "STATUS", "VALID", "CERT", "SERIAL", "NUMBER", "NOT", "AFTER", "NOT", "BEFORE"},
		{broken.Identity, "NA", "Unavailable", "false", "NA", "NA", "NA"},
		{id.String(), "Leaf", "Available", "true", cert.Leaf.SerialNumber.Text(16)},
		{id.String(), "Intermediate", "Available", "true", inter.SerialNumber.Text(16)},
		{id.String(), "Root", "Available", "true", root.SerialNumber.Text(16)},
	}
	for i, want := range wantFields {
		got := strings.Fields(lines[i])
		if len(got) < len(want) {
			t.Fatalf("line %d: %q", i, lines[i])
		}
		for j := range want {
			if got[j] != want[j] {
				t.Errorf("line %d field %d = %q, want %q\n%s", i, j, got[j], want[j], out.String())
			}
		}
	}
	// Expired elements are not valid.
	out.Reset()
	writeCertificates(&out, []certmanager.CertificateStatus{c}, time.Now().Add(2*time.Hour))
	if !strings.Contains(strings.Split(out.String(), "\n")[1], "false") {
		t.Errorf("expired leaf shown valid:\n%s", out.String())
	}
}

func TestLoadDumpErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte("{not json"), 0o600)
	for _, args := range [][]string{{}, {"--file", bad}, {"--file", filepath.Join(dir, "missing")}, {"--admin", "x", "--file", bad}} {
		if _, err := loadDump("t", args); err == nil {
			t.Errorf("loadDump(%v) succeeded", args)
		}
	}
}
