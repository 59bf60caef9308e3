package l7

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// An ingress gateway's routing: its listeners' routes, chosen per request
// by port and host (listener isolation), and backends reached over HBONE,
// through their waypoint when they are bound to one.

// CompileGateway builds the routing state of an ingress gateway: a route
// table per listener (the routes attached to it; a listener without
// routes answers 404), and the services its routes name, whose traffic
// goes through the waypoint the service (else the endpoint's workload) is
// bound to, as a node proxy's would: a bound destination never sees the
// gateway's traffic without its waypoint. waypoints are by
// "<namespace>/<name>". Nothing in the input makes it fail (see Compile).
func CompileGateway(listeners []*meshv1.IngressListener, services []*meshv1.Service, workloads []*meshv1.Workload, waypoints []*meshv1.Waypoint) *Config {
	byName := make(map[string]*meshv1.Waypoint, len(waypoints))
	for _, wp := range waypoints {
		byName[wp.GetNamespace()+"/"+wp.GetName()] = wp
	}
	c := newConfig(services, workloads)
	c.waypoints, c.listeners = byName, map[uint32][]*listenerTable{}
	for _, si := range c.services {
		c.throughWaypoints(si)
		sortTargets(si)
	}
	for _, l := range listeners {
		a := &attachments{}
		for _, r := range sortedRoutes(l.GetHttpRoutes()) {
			if cr := c.compileHTTPRoute(r); cr != nil {
				a.http = append(a.http, cr)
			}
		}
		for _, r := range sortedRoutes(l.GetGrpcRoutes()) {
			if cr := c.compileGRPCRoute(r); cr != nil {
				a.grpc = append(a.grpc, cr)
			}
		}
		t := &routeTable{key: tableKey{ServiceRef{Namespace: "listener", Name: l.GetName()}, l.GetPort()}, protocol: ProtocolHTTP}
		c.buildTable(t, a)
		c.listeners[l.GetPort()] = append(c.listeners[l.GetPort()], &listenerTable{name: l.GetName(), hostname: l.GetHostname(), table: t})
	}
	slices.Sort(c.problems)
	return c
}

func sortedRoutes[R route](rs []R) []R {
	out := slices.Clone(rs)
	slices.SortFunc(out, func(a, b R) int {
		return cmp.Or(strings.Compare(a.GetNamespace(), b.GetNamespace()), strings.Compare(a.GetName(), b.GetName()))
	})
	return out
}

// listenerFor is the listener of port that serves host: the highest
// meshv1.HostRank, as the control plane ranks them.
func (c *Config) listenerFor(port uint32, host string) (*listenerTable, bool) {
	var best *listenerTable
	bestRank := -1
	for _, l := range c.listeners[port] {
		if r := meshv1.HostRank(l.hostname, host); r > bestRank {
			best, bestRank = l, r
		}
	}
	return best, best != nil
}

// throughWaypoints replaces the targets of a service bound to a waypoint
// (or of endpoints whose workload is) by that waypoint's pods, addressed
// with the service VIP:port (or the endpoint's address), as a node proxy
// sends a bound destination's traffic. A waypoint the gateway does not
// know leaves the destination without targets: its requests get 503,
// never a tunnel around the waypoint.
func (c *Config) throughWaypoints(si *serviceInfo) {
	s := si.svc
	if why := s.GetInvalidReason(); why != "" {
		c.problem("service %s: refused by the control plane: %s; not reached", si.ref, why)
		clear(si.targets)
		return
	}
	if ref := s.GetWaypoint(); ref != nil {
		vip, err := netip.ParseAddr(firstOf(s.GetVips()))
		for port := range si.targets {
			si.targets[port] = nil
			if err != nil {
				c.problem("service %s: bound to waypoint %s/%s but has no VIP to address it with", si.ref, ref.GetNamespace(), ref.GetName())
				continue
			}
			si.targets[port] = c.waypointTargets(si.ref, ref, netip.AddrPortFrom(vip.Unmap(), uint16(port)))
		}
		return
	}
	for port, ts := range si.targets {
		var out []Target
		for _, t := range ts {
			if ref := t.Workload.GetWaypoint(); ref != nil {
				out = append(out, c.waypointTargets(si.ref, ref, t.Address)...)
			} else {
				out = append(out, t)
			}
		}
		si.targets[port] = out
	}
}

// waypointTargets are the pods of waypoint ref, reaching authority.
func (c *Config) waypointTargets(svc ServiceRef, ref *meshv1.Ref, authority netip.AddrPort) []Target {
	wp := c.waypoints[ref.GetNamespace()+"/"+ref.GetName()]
	id, err := trust.ParseIdentity(wp.GetIdentity())
	if wp == nil || err != nil {
		c.problem("service %s: waypoint %s/%s is not known; not reached", svc, ref.GetNamespace(), ref.GetName())
		return nil
	}
	port := uint16(wp.GetHbonePort())
	if port == 0 {
		port = 15008
	}
	var out []Target
	for _, a := range wp.GetAddresses() {
		if ip, err := netip.ParseAddr(a); err == nil {
			out = append(out, Target{Address: authority, Via: netip.AddrPortFrom(ip.Unmap(), port), Identity: id, Service: svc})
		}
	}
	return out
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}
