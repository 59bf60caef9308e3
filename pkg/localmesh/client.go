package localmesh

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/proxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// PodClient makes connections as a pod does: from the pod's IP, and for
// mesh pods through their node proxy's SOCKS5 (hostnames such as
// reviews.shop are resolved by the mesh).
type PodClient struct {
	Pod PodPlan
}

// Client returns a client acting as the pod "namespace/name" (or "name").
func (p *Plan) Client(ref string) (*PodClient, error) {
	pod, err := p.Pod(ref)
	if err != nil {
		return nil, err
	}
	return &PodClient{Pod: pod}, nil
}

// DialContext connects to addr (ip:port or host:port) as the pod.
func (c *PodClient) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	local := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(c.Pod.IP)}, Timeout: 10 * time.Second}
	if c.Pod.SOCKS5 == "" {
		return local.DialContext(ctx, network, addr)
	}
	d, err := proxy.SOCKS5("tcp", c.Pod.SOCKS5, nil, local)
	if err != nil {
		return nil, err
	}
	conn, err := d.(proxy.ContextDialer).DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("%s/%s via SOCKS5 %s: %w", c.Pod.Namespace, c.Pod.Name, c.Pod.SOCKS5, err)
	}
	return conn, nil
}

// HTTP returns an HTTP/1.1 client (h2c: HTTP/2 with prior knowledge) whose
// connections leave as the pod.
func (c *PodClient) HTTP(h2c bool) *http.Client {
	if h2c {
		return &http.Client{Timeout: 30 * time.Second, Transport: &http2.Transport{AllowHTTP: true,
			DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
				return c.DialContext(ctx, network, addr)
			}}}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: c.DialContext,
		DisableKeepAlives: true}}
}

// GRPC connects a gRPC client to target (host:port) as the pod.
func (c *PodClient) GRPC(target string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.DialContext(ctx, "tcp", addr)
		}))
}
