package l7

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// Dialer opens a connection to an endpoint: the waypoint implements it with
// an HBONE tunnel to the endpoint's pod IP:15008 under the waypoint's own
// identity, verifying Target.Identity. It must honour ctx.
type Dialer interface {
	DialEndpoint(ctx context.Context, t Target) (net.Conn, error)
}

// connectError marks a failure to reach an endpoint: nothing was sent, so
// the request can always go to another endpoint.
type connectError struct {
	target netip.AddrPort
	err    error
}

func (e *connectError) Error() string {
	return fmt.Sprintf("connect to %s: %v", e.target, e.err)
}

func (e *connectError) Unwrap() error { return e.err }

// endpointKey identifies an endpoint across configuration versions, so its
// pooled connections, load and health survive unrelated config changes. The
// identity is part of the key: a pod IP reused by another workload gets
// fresh connections verified against the new identity; so does a change
// of the port's BackendTLSPolicy.
type endpointKey struct {
	addr     netip.AddrPort
	identity string
	tls      string // Target.TLSKey: TLS settings changed, fresh connections
	via      netip.AddrPort
}

// endpoint is an endpoint's shared state: outstanding requests (for least
// request balancing), health, and the HTTP connection pools over tunnels.
type endpoint struct {
	key         endpointKey
	addr        string // key.addr, for URLs and log lines
	target      atomic.Pointer[Target]
	outstanding atomic.Int64
	ejectedTill atomic.Int64 // unix nanoseconds; connect failures eject for a while
	failures    atomic.Int32 // consecutive connect failures

	pool       *pools
	h1once     sync.Once
	h1         atomic.Pointer[http.Transport]
	h2once     sync.Once
	h2         atomic.Pointer[http2.Transport]
	inlineOnce sync.Once
	inline     atomic.Pointer[h1.Client]
}

// pools owns every endpoint's connection pools.
type pools struct {
	dialer      Dialer
	idleTimeout time.Duration
	ejection    time.Duration
	maxHeader   int64

	mu        sync.Mutex
	endpoints map[endpointKey]*endpoint
}

func newPools(d Dialer, idle, ejection time.Duration, maxHeader int64) *pools {
	return &pools{dialer: d, idleTimeout: idle, ejection: ejection, maxHeader: maxHeader, endpoints: make(map[endpointKey]*endpoint)}
}

// get returns the shared state of the endpoint t, creating it if needed.
func (p *pools) get(t Target) *endpoint {
	k := endpointKey{t.Address, t.Identity.String(), t.TLSKey, t.Via}
	p.mu.Lock()
	defer p.mu.Unlock()
	ep := p.endpoints[k]
	if ep == nil {
		ep = &endpoint{key: k, addr: k.addr.String(), pool: p}
		p.endpoints[k] = ep
	}
	tc := t
	ep.target.Store(&tc)
	return ep
}

// retain forgets the endpoints keep rejects and closes their idle
// connections. Requests in flight on them finish; those connections then
// idle out.
func (p *pools) retain(keep func(endpointKey) bool) {
	var gone []*endpoint
	p.mu.Lock()
	for k, ep := range p.endpoints {
		if !keep(k) {
			delete(p.endpoints, k)
			gone = append(gone, ep)
		}
	}
	p.mu.Unlock()
	for _, ep := range gone {
		ep.closeIdle()
	}
}

func (p *pools) closeAll() {
	p.retain(func(endpointKey) bool { return false })
}

func (ep *endpoint) closeIdle() {
	if c := ep.inlineH1(false); c != nil {
		c.CloseIdleConnections()
	}
	if t := ep.h1T(false); t != nil {
		t.CloseIdleConnections()
	}
	if t := ep.h2T(false); t != nil {
		t.CloseIdleConnections()
	}
}

// dial opens a tunnel to the endpoint for a connection carrying alpn,
// recording connect failures.
func (ep *endpoint) dial(ctx context.Context, alpn string) (net.Conn, error) {
	t := *ep.target.Load()
	t.ALPN = alpn
	c, err := ep.pool.dialer.DialEndpoint(ctx, t)
	if err != nil {
		if ctx.Err() == nil && !pastDeadline(ctx) {
			ep.markFailed() // not when our own deadline cut the dial short
		}
		return nil, &connectError{target: t.Address, err: err}
	}
	ep.failures.Store(0)
	ep.ejectedTill.Store(0)
	return c, nil
}

// markFailed ejects the endpoint for the ejection time, doubled for each
// consecutive failure up to eight times that.
func (ep *endpoint) markFailed() {
	n := min(ep.failures.Add(1), 4)
	d := ep.pool.ejection << (n - 1)
	ep.ejectedTill.Store(time.Now().Add(d).UnixNano())
}

func (ep *endpoint) healthy(now int64) bool { return ep.ejectedTill.Load() <= now }

// h1T returns the endpoint's HTTP/1.1 pool (keep-alive connections, each over
// its own tunnel), creating it when create is set.
func (ep *endpoint) h1T(create bool) *http.Transport {
	if create {
		ep.h1once.Do(func() {
			ep.h1.Store(&http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return ep.dial(ctx, "http/1.1")
				},
				// The body goes to the client as the backend sent it.
				DisableCompression:     true,
				MaxIdleConnsPerHost:    64,
				IdleConnTimeout:        ep.pool.idleTimeout,
				MaxResponseHeaderBytes: ep.pool.maxHeader,
				ExpectContinueTimeout:  time.Second,
			})
		})
	}
	return ep.h1.Load()
}

// h2T returns the endpoint's HTTP/2 pool: requests multiplex over one
// cleartext HTTP/2 connection inside one tunnel (more when the peer's
// concurrent stream limit is reached).
func (ep *endpoint) h2T(create bool) *http2.Transport {
	if create {
		ep.h2once.Do(func() {
			ep.h2.Store(&http2.Transport{
				AllowHTTP: true,
				DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
					return ep.dial(ctx, "h2")
				},
				DisableCompression: true,
				IdleConnTimeout:    ep.pool.idleTimeout,
				ReadIdleTimeout:    30 * time.Second,
				PingTimeout:        15 * time.Second,
				MaxHeaderListSize:  uint32(min(ep.pool.maxHeader, 1<<30)),
			})
		})
	}
	return ep.h2.Load()
}

// inlineH1 returns the endpoint's HTTP/1.1 client for requests without a
// body, creating it when create is set.
func (ep *endpoint) inlineH1(create bool) *h1.Client {
	if create {
		ep.inlineOnce.Do(func() {
			dial := func(ctx context.Context) (net.Conn, error) { return ep.dial(ctx, "http/1.1") }
			ep.inline.Store(&h1.Client{Dial: dial, IdleTimeout: ep.pool.idleTimeout, MaxHeaderBytes: ep.pool.maxHeader})
		})
	}
	return ep.inline.Load()
}

// roundTripper returns what sends a request to the endpoint in protocol
// p; plain: h1.Inlinable holds for the request.
func (ep *endpoint) roundTripper(p upstreamProto, plain bool) http.RoundTripper {
	if p == upstreamH2 {
		return ep.h2T(true)
	}
	if plain && ep.inlinable() {
		return ep.inlineH1(true)
	}
	return ep.h1T(true)
}

// inlinable: the inline HTTP/1.1 client can reuse the endpoint's
// connections. It tells an idle connection that received bytes by asking
// the tunnel or the socket, which a TLS connection's buffered records hide,
// so TLS endpoints go through net/http's Transport, whose reader sees them.
func (ep *endpoint) inlinable() bool { return ep.key.tls == "" }

// endpointTiers are a service port's endpoints grouped by how close they
// are to the waypoint (locality.Rank, by the service's
// trafficDistribution), closest first, no group empty; one group when the
// service states no preference.
type endpointTiers [][]*endpoint

// pickEndpoint chooses from the closest tier with a healthy candidate, by
// least outstanding requests among two random candidates (power of two
// choices). Ejected endpoints are skipped while others are healthy; when
// none is, all are candidates again, closest tier first, so one blip
// cannot turn into an outage (Envoy's panic mode). skip excludes endpoints
// (already tried, or a different identity than the one authorized).
func pickEndpoint(tiers endpointTiers, skip func(*endpoint) bool) *endpoint {
	now := time.Now().UnixNano()
	for _, eps := range tiers {
		if ep := pickFrom(eps, func(ep *endpoint) bool { return ep.healthy(now) && (skip == nil || !skip(ep)) }); ep != nil {
			return ep
		}
	}
	for _, eps := range tiers {
		if ep := pickFrom(eps, func(ep *endpoint) bool { return skip == nil || !skip(ep) }); ep != nil {
			return ep
		}
	}
	return nil
}

// pickFrom is the less loaded of two random endpoints of eps that ok
// accepts, or nil when it accepts none.
func pickFrom(eps []*endpoint, ok func(*endpoint) bool) *endpoint {
	var buf [16]*endpoint
	cands := buf[:0]
	for _, ep := range eps {
		if ok(ep) {
			cands = append(cands, ep)
		}
	}
	switch len(cands) {
	case 0:
		return nil
	case 1:
		return cands[0]
	}
	i := rand.IntN(len(cands))
	j := rand.IntN(len(cands) - 1)
	if j >= i {
		j++
	}
	a, b := cands[i], cands[j]
	if b.outstanding.Load() < a.outstanding.Load() {
		return b
	}
	return a
}

// pastDeadline reports whether ctx's deadline has passed. An I/O deadline
// taken from ctx (a dial's, a connection's) can fire a moment before ctx's
// own timer cancels it, so ctx.Err() alone may not know yet.
func pastDeadline(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}
