// Package caclient asks the mesh CA (caserver, or any Istio-compatible CA)
// for certificates: the node proxy's and waypoint's side of the CSR flow.
// The private key never reaches this package; only the CSR does.
package caclient

import (
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"

	"github.com/causeway-mesh/causeway/pkg/readlimit"
	"github.com/causeway-mesh/causeway/pkg/reconnect"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

const (
	// ImpersonatedIdentityKey is the metadata field naming the identity asked
	// for, as ztunnel sends it.
	ImpersonatedIdentityKey = "ImpersonatedIdentity"
	// DefaultTimeout bounds a request whose context has no deadline.
	DefaultTimeout = 30 * time.Second
	// maxResponse bounds the CA's answer.
	maxResponse = 1 << 20
	// maxChain bounds the number of chain elements accepted.
	maxChain = 16
	// maxTokenFile bounds a token read from a file.
	maxTokenFile = 64 << 10
)

// TokenSource returns the bearer token to present on each request.
type TokenSource func(ctx context.Context) (string, error)

// StaticToken always presents tok.
func StaticToken(tok string) TokenSource {
	return func(context.Context) (string, error) { return tok, nil }
}

// TokenFromFile presents the content of a file, read on every request so
// that a rotated token (a projected service account token, a rewritten
// local tokens file entry) is picked up.
func TokenFromFile(path string) TokenSource {
	return func(context.Context) (string, error) {
		data, err := readlimit.File(path, maxTokenFile)
		if err != nil {
			return "", fmt.Errorf("token %s: %w", path, err)
		}
		tok := strings.TrimSpace(string(data))
		if tok == "" {
			return "", fmt.Errorf("token %s: empty", path)
		}
		return tok, nil
	}
}

// Options configure a Client.
type Options struct {
	// Address of the CA, host:port (the control plane's 15012).
	Address string
	// Bundle holds the roots the CA's serving certificate must chain to.
	Bundle *trust.Bundle
	// ServerIdentity is the identity the CA must present, e.g.
	// spiffe://<td>/ns/causeway-system/sa/controlplane.
	ServerIdentity trust.Identity
	// Token, if set, is sent as "authorization: Bearer <token>".
	Token TokenSource
	// ClientCertificate, if set, is presented as a mesh client certificate
	// (authentication by certificate; the CA then grants only its identity).
	ClientCertificate func() (*tls.Certificate, error)
}

// Client requests certificates from the CA over one gRPC connection
// (established lazily, made anew after it failed).
type Client struct {
	conn *reconnect.Conn
}

// New returns a client for the CA; it does not connect yet.
func New(o Options) (*Client, error) {
	if o.Address == "" {
		return nil, errors.New("CA client: no address")
	}
	if o.Bundle == nil {
		return nil, errors.New("CA client: no trust bundle to verify the CA with")
	}
	if o.ServerIdentity.IsZero() {
		return nil, errors.New("CA client: no expected CA identity")
	}
	tlsConf := trust.ClientConfig(o.Bundle, o.ClientCertificate, []trust.Identity{o.ServerIdentity})
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(tlsConf)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxResponse)),
	}
	if o.Token != nil {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(bearer(o.Token)))
	}
	conn, err := reconnect.NewConn(o.Address, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("CA client for %s: %w", o.Address, err)
	}
	return &Client{conn: conn}, nil
}

// Close releases the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Fetch sends csrPEM to the CA asking for id, valid for ttl (0: the CA's
// default), and returns the PEM chain, leaf first, root(s) last. The answer
// is checked: the leaf must name exactly id and carry the CSR's key.
func (c *Client) Fetch(ctx context.Context, id trust.Identity, csrPEM []byte, ttl time.Duration) ([]string, error) {
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", id, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	secs := int64(0)
	if ttl > 0 {
		secs = int64((ttl + time.Second - 1) / time.Second)
	}
	// The caller (the certificate manager) paces its retries; each one
	// reaches the CA at once (reconnect.Conn).
	resp, err := securityapi.NewIstioCertificateServiceClient(c.conn.Get()).CreateCertificate(ctx, &securityapi.IstioCertificateRequest{
		Csr:              string(csrPEM),
		ValidityDuration: secs,
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			ImpersonatedIdentityKey: structpb.NewStringValue(id.String()),
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", id, err)
	}
	chain := resp.GetCertChain()
	if len(chain) == 0 || len(chain) > maxChain {
		return nil, fmt.Errorf("certificate for %s: CA answered with %d chain elements", id, len(chain))
	}
	leafs, err := trust.ParseCertificatesPEM([]byte(chain[0]))
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: leaf: %w", id, err)
	}
	leaf := leafs[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() {
		return nil, fmt.Errorf("certificate for %s: CA issued a certificate for %v", id, leaf.URIs)
	}
	if k, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(csr.PublicKey) {
		return nil, fmt.Errorf("certificate for %s: CA issued a certificate for another key", id)
	}
	for i, p := range chain[1:] {
		if _, err := trust.ParseCertificatesPEM([]byte(p)); err != nil {
			return nil, fmt.Errorf("certificate for %s: chain element %d: %w", id, i+1, err)
		}
	}
	return chain, nil
}

// bearer sends the token on each call; only over TLS.
type bearer TokenSource

func (b bearer) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	tok, err := b(ctx)
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }
