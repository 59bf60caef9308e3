package nodeproxy

import (
	"context"
	"fmt"
	"net/netip"

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
}

// UpdateConnectionPolicies installs the connection policies from the
// control plane; open connections are re-checked if anything changed.
func (p *Proxy) UpdateConnectionPolicies(ctx context.Context, policies []*meshv1.ConnectionPolicy) {
	if p.policies.Update(ctx, policies) {
		p.open.Request()
	}
}

// RecheckConnections decides again about every open inbound connection
// and closes those no longer admitted (Update and
// UpdateConnectionPolicies ask for it in the background).
func (p *Proxy) RecheckConnections(ctx context.Context) (checked, closed int) {
	return p.open.RecheckAll(ctx)
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

// track follows an admitted connection (connpolicy.Tracker.Track); a
// re-check that denies it calls revoke.
func (p *Proxy) track(ctx context.Context, c *inboundConn, revoke func()) (*connpolicy.Open, func()) {
	return p.open.Track(ctx,
		func(ctx context.Context) (connpolicy.Verdict, error) {
			_, v, err := p.admit(ctx, c, true)
			return v, err
		},
		func() bool { return c.reg != p.reg.Load() || c.table != p.policies.Current() },
		revoke,
		func() []zap.Field {
			return []zap.Field{zap.String("src", c.remote.String()), zap.String("src_identity", c.peer.String()), zap.String("dst", c.authority.String())}
		})
}
