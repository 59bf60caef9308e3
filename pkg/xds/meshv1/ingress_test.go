package meshv1

import (
	"bytes"
	"encoding/base64"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
)

// A dump of an IngressGateway shows no private key; the served message
// keeps it.
func TestRedacted(t *testing.T) {
	key := []byte("-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n")
	g := &IngressGateway{Name: "gw", Namespace: "edge", Listeners: []*IngressListener{{Name: "https", Port: 443, Protocol: IngressListener_HTTPS,
		Certificates: []*TLSKeyPair{{Secret: "edge/cert", CertificateChain: []byte("chain"), PrivateKey: key}}}}}
	out, err := protojson.Marshal(Redacted(g))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(base64.StdEncoding.EncodeToString(key))) || !bytes.Contains(out, []byte("edge/cert")) {
		t.Errorf("dump %s", out)
	}
	if !bytes.Equal(g.Listeners[0].Certificates[0].PrivateKey, key) {
		t.Error("Redacted changed the served message")
	}
	w := &Workload{Uid: "u"}
	if Redacted(w) != w {
		t.Error("other messages are not themselves")
	}
}

// HostRank: exact above the narrowest wildcard above a catch-all.
func TestHostRank(t *testing.T) {
	for _, tc := range []struct {
		hostname, host string
		want           int
	}{
		{"", "a.example.com", 0},
		{"a.example.com", "A.Example.com.", 1 << 16},
		{"*.example.com", "a.example.com", 13},
		{"*.example.com", "a.b.example.com", 13},
		{"*.b.example.com", "a.b.example.com", 15},
		{"*.example.com", "example.com", -1},
		{"a.example.com", "b.example.com", -1},
	} {
		if got := HostRank(tc.hostname, tc.host); got != tc.want {
			t.Errorf("HostRank(%q, %q) = %d, want %d", tc.hostname, tc.host, got, tc.want)
		}
	}
}
