package caserver_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/caserver"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

// FuzzCreateCertificate drives the CA's request path (authorization header,
// impersonation metadata, CSR, validity) with arbitrary input. A refusal
// must be a gRPC status with a reason; an issuance must name an identity
// the caller's token entitles it to, for no longer than the CA's maximum.
func FuzzCreateCertificate(f *testing.F) {
	ca := trusttest.NewCA(f, "cluster.local")
	path := filepath.Join(f.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(tokNodeA+" causeway-system/nodeproxy node-a\n"+tokWeb+" shop/web node-a\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	tokens, err := authn.NewTokenFile(path, "cluster.local", nil)
	if err != nil {
		f.Fatal(err)
	}
	srv, err := caserver.New(caserver.Options{
		Authority:           ca.Authority,
		TrustDomain:         "cluster.local",
		Authenticator:       tokens,
		TrustedNodeAccounts: []trust.Identity{trusttest.Identity(f, "spiffe://cluster.local/ns/causeway-system/sa/nodeproxy")},
		Workloads:           trust.WorkloadList{{Node: "node-a", Identity: trusttest.Identity(f, web)}},
	})
	if err != nil {
		f.Fatal(err)
	}
	// What each token may obtain.
	entitled := map[string][]string{
		tokNodeA: {"spiffe://cluster.local/ns/causeway-system/sa/nodeproxy", web},
		tokWeb:   {web},
	}
	webCSR := string(csrPEM(f, web))
	f.Add("Bearer "+tokNodeA, web, webCSR, int64(3600))
	f.Add("Bearer "+tokWeb, "", webCSR, int64(0))
	f.Add("bearer  "+tokWeb+" ", web, webCSR, int64(-1))
	f.Add("Bearer "+tokNodeA, "spiffe://cluster.local/ns/shop/sa/db", webCSR, int64(1<<40))
	f.Add("Basic "+tokWeb, api, "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", int64(1))
	f.Add("", "", "", int64(0))
	f.Fuzz(func(t *testing.T, authz, impersonate, csr string, validity int64) {
		ctx := context.Background()
		if authz != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", authz))
		}
		var md *structpb.Struct
		if impersonate != "" {
			md = &structpb.Struct{Fields: map[string]*structpb.Value{caserver.ImpersonatedIdentityKey: structpb.NewStringValue(impersonate)}}
		}
		resp, err := srv.CreateCertificate(ctx, &securityapi.IstioCertificateRequest{Csr: csr, ValidityDuration: validity, Metadata: md})
		if err != nil {
			st, ok := status.FromError(err)
			if !ok || st.Message() == "" {
				t.Fatalf("refusal is not a status with a reason: %v", err)
			}
			return
		}
		_, token, _ := strings.Cut(authz, " ")
		token = strings.TrimSpace(token)
		certs, err := trust.ParseCertificatesPEM([]byte(strings.Join(resp.GetCertChain(), "")))
		if err != nil || len(certs) == 0 || len(certs[0].URIs) != 1 {
			t.Fatalf("issued an unreadable chain: %v", err)
		}
		got := certs[0].URIs[0].String()
		ok := false
		for _, id := range entitled[token] {
			ok = ok || id == got
		}
		if !ok {
			t.Fatalf("header %q obtained %s", authz, got)
		}
		if life := certs[0].NotAfter.Sub(certs[0].NotBefore); life > ca.Authority.MaxTTL()+2*time.Minute {
			t.Fatalf("issued for %v, beyond the maximum %v", life, ca.Authority.MaxTTL())
		}
	})
}
