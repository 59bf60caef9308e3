package nodeproxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/connpolicy"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// inboundConn is an inbound connection to a local pod, as the connection
// policies see it. Once open it is tracked, and re-checked whenever the
// policies or the registry change: a connection they no longer admit is
// closed.
type inboundConn struct {
	local     netip.Addr     // the pod address whose listener took it
	authority netip.AddrPort // the destination: pod IP and port
	peer      trust.Peer     // unauthenticated for plaintext from outside the mesh
	remote    netip.AddrPort
	plaintext bool // no tunnel: nothing to admit, only the policies

	// What it was admitted under, so a change between the decision and
	// tracking is not missed.
	reg   *Registry
	table *connpolicy.Table

	revoke  func()                 // ends its relay, resetting both sides
	revoked atomic.Pointer[string] // why a re-check closed it
}

// errRevoked marks a connection a re-check closed.
var errRevoked = errors.New("closed by connection policy re-check")

// UpdateConnectionPolicies installs the connection policies from the
// control plane; open connections are re-checked if anything changed.
func (p *Proxy) UpdateConnectionPolicies(ctx context.Context, policies []*meshv1.ConnectionPolicy) {
	if p.policies.Update(ctx, policies) {
		p.requestRecheck()
	}
}

func (p *Proxy) requestRecheck() {
	select {
	case p.recheck <- struct{}{}:
	default: // one is pending: it will see this change too
	}
}

// authorizeInbound evaluates the policies selecting w for c.
func (p *Proxy) authorizeInbound(ctx context.Context, r *Registry, t *connpolicy.Table, c *inboundConn, w *meshv1.Workload, fromWaypoint bool, recheck bool) connpolicy.Verdict {
	selected := t.ForWorkload(w)
	if len(selected) == 0 {
		return connpolicy.Verdict{Allowed: true}
	}
	req := &policy.ConnectionRequest{Source: c.peer, SourceAddr: c.remote, DestAddr: c.authority,
		DestinationWorkload: &policy.Workload{Namespace: w.GetNamespace(), Name: w.GetName(), UID: w.GetUid(),
			ServiceAccount: w.GetServiceAccount(), Labels: w.GetLabels()},
		DestinationServices: r.ServiceHostnames(w.GetUid(), c.authority.Port()),
		FromWaypoint:        fromWaypoint}
	if id, err := trust.ParseIdentity(w.GetIdentity()); err == nil {
		req.Destination = id
	}
	if recheck {
		return p.policies.Recheck(ctx, selected, req)
	}
	return p.policies.Authorize(ctx, selected, req)
}

// admit decides about c under the registry and policies in force: the
// tunnel admission (waypoint-only ingress), then the policies. The first
// decision records in c what it was made under.
func (p *Proxy) admit(ctx context.Context, c *inboundConn, recheck bool) (admission, connpolicy.Verdict, error) {
	r, t := p.reg.Load(), p.policies.Current()
	if !recheck {
		c.reg, c.table = r, t
	}
	var adm admission
	if c.plaintext {
		w, ok := r.LocalWorkload(c.authority.Addr())
		if !ok {
			return adm, connpolicy.Verdict{}, fmt.Errorf("%s is not a mesh pod on node %s", c.authority.Addr(), r.node)
		}
		adm.Workload = w
	} else {
		var err error
		if adm, err = r.admitInbound(c.local, c.authority, c.peer); err != nil {
			return adm, connpolicy.Verdict{}, err
		}
	}
	return adm, p.authorizeInbound(ctx, r, t, c, adm.Workload, adm.FromWaypoint, recheck), nil
}

// track follows an open connection until the returned function is
// called. A re-check that denies it calls revoke, which must end its relay
// (resetting the upstream connection does). A change since its decision
// re-checks it at once.
func (p *Proxy) track(ctx context.Context, c *inboundConn, revoke func()) (untrack func()) {
	c.revoke = revoke
	p.connsMu.Lock()
	p.conns[c] = struct{}{}
	p.connsMu.Unlock()
	if c.reg != p.reg.Load() || c.table != p.policies.Current() {
		p.recheckOne(ctx, c)
	}
	return func() {
		p.connsMu.Lock()
		delete(p.conns, c)
		p.connsMu.Unlock()
	}
}

// result is err, or why a re-check closed the connection.
func (c *inboundConn) result(err error) error {
	if why := c.revoked.Load(); why != nil {
		return fmt.Errorf("%w: %s", errRevoked, *why)
	}
	return err
}

// recheckOne decides about an open connection again and closes it when
// the answer is no longer yes. It reports whether it closed it.
func (p *Proxy) recheckOne(ctx context.Context, c *inboundConn) bool {
	_, v, err := p.admit(ctx, c, true)
	if err == nil && v.Allowed {
		return false
	}
	reason := v.Reason
	if err != nil {
		reason = err.Error()
	}
	if !c.revoked.CompareAndSwap(nil, &reason) {
		return false // already closed
	}
	c.revoke()
	p.log.Info("open connection no longer authorized; closed",
		zap.String("src", c.remote.String()), zap.String("src_identity", c.peer.String()), zap.String("dst", c.authority.String()),
		zap.String("policy", v.Policy), zap.String("policy_revision", v.Revision), zap.String("decision_id", v.DecisionID), zap.String("reason", reason))
	return true
}

// RecheckConnections decides again about every open inbound connection,
// on all CPUs, and closes those no longer admitted; it returns how many
// it checked and closed.
func (p *Proxy) RecheckConnections(ctx context.Context) (checked, closed int) {
	p.connsMu.Lock()
	list := make([]*inboundConn, 0, len(p.conns))
	for c := range p.conns {
		list = append(list, c)
	}
	p.connsMu.Unlock()
	var next, n atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), max(len(list), 1)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(list) {
					return
				}
				if p.recheckOne(ctx, list[i]) {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return len(list), int(n.Load())
}

// runRechecks re-checks open connections after every change until ctx ends.
func (p *Proxy) runRechecks(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.recheck:
			if checked, closed := p.RecheckConnections(ctx); closed > 0 {
				p.log.Info("connections re-checked after a change", zap.Int("checked", checked), zap.Int("closed", closed))
			}
		}
	}
}
