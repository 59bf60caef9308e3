package config

import (
	"fmt"
	"net/netip"
	"strings"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// AddressPool is the set of IP addresses ingress Gateways may claim in
// spec.addresses (the control plane's --gateway-address-cidrs). The zero
// pool allows none: a Gateway then cannot name an address at all. A
// Gateway's address is carried as its Service's externalIPs, which every
// node's kube-proxy serves; without the pool any tenant could take any
// address, other tenants' and the cluster's own included (CVE-2020-8554).
type AddressPool struct {
	prefixes []netip.Prefix
}

// ParseAddressPool reads CIDRs ("192.0.2.0/28", "2001:db8::/120"; a bare
// address is one /32 or /128), comma-separated.
func ParseAddressPool(s string) (AddressPool, error) {
	var p AddressPool
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		pf, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil || a.Zone() != "" {
				return AddressPool{}, fmt.Errorf("%q: not a CIDR or an IP address", f)
			}
			pf = netip.PrefixFrom(a, a.BitLen())
		}
		if pf != pf.Masked() {
			return AddressPool{}, fmt.Errorf("%q: host bits set (the network is %s)", f, pf.Masked())
		}
		p.prefixes = append(p.prefixes, pf)
	}
	return p, nil
}

// Empty says whether the pool allows no address.
func (p AddressPool) Empty() bool { return len(p.prefixes) == 0 }

// Contains says whether a is in the pool.
func (p AddressPool) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, pf := range p.prefixes {
		if pf.Contains(a) {
			return true
		}
	}
	return false
}

func (p AddressPool) String() string {
	s := make([]string, len(p.prefixes))
	for i, pf := range p.prefixes {
		s[i] = pf.String()
	}
	return strings.Join(s, ", ")
}

// StaticAddresses are the addresses an ingress Gateway's spec.addresses
// name (IPAddress entries with a value), normalized, in spec order;
// entries it cannot read are left out (GatewayRejection refuses them).
func StaticAddresses(gw *gwv1.Gateway) []netip.Addr {
	var out []netip.Addr
	for _, a := range gw.Spec.Addresses {
		if a.Value == "" || a.Type != nil && *a.Type != gwv1.IPAddressType {
			continue
		}
		if ip, err := netip.ParseAddr(a.Value); err == nil && ip.Zone() == "" {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// AssignedAddress says whether an ingress Gateway takes an address the
// cluster assigns (its Service's): it names no address, or asks for an
// IPAddress without a value next to the ones it names.
func AssignedAddress(gw *gwv1.Gateway) bool {
	if len(gw.Spec.Addresses) == 0 {
		return true
	}
	for _, a := range gw.Spec.Addresses {
		if a.Value == "" {
			return true
		}
	}
	return false
}

// GatewayAddresses is what an accepted ingress Gateway's static addresses
// come to: those it may hold (its Service's externalIPs), and why each
// other one cannot be used.
type GatewayAddresses struct {
	Usable   []string
	Unusable []string // messages naming the address
}

// ResolveAddresses checks gw's static addresses against the pool and the
// claims of the other ingress Gateways of ours (gateways; gw among them or
// not): an address goes to the Gateway that claimed it first (oldest, then
// by namespace/name), so a later Gateway cannot take over another's
// address. Only accepted claimants count (GatewayRejection).
func ResolveAddresses(gw *gwv1.Gateway, pool AddressPool, gateways []*gwv1.Gateway) GatewayAddresses {
	var out GatewayAddresses
	for _, ip := range StaticAddresses(gw) {
		if !pool.Contains(ip) {
			out.Unusable = append(out.Unusable, fmt.Sprintf("%s is not among the addresses the operator allows Gateways to claim (%s)", ip, pool))
			continue
		}
		if o := firstClaimant(ip, pool, gateways); o != nil && (o.Namespace != gw.Namespace || o.Name != gw.Name) && claimsBefore(o, gw) {
			out.Unusable = append(out.Unusable, fmt.Sprintf("%s is held by Gateway %s/%s, which claimed it first", ip, o.Namespace, o.Name))
			continue
		}
		out.Usable = append(out.Usable, ip.String())
	}
	return out
}

// firstClaimant is the accepted ingress Gateway of gateways that claimed
// ip first, or nil.
func firstClaimant(ip netip.Addr, pool AddressPool, gateways []*gwv1.Gateway) *gwv1.Gateway {
	var first *gwv1.Gateway
	for _, g := range gateways {
		if string(g.Spec.GatewayClassName) != IngressClass || g.DeletionTimestamp != nil {
			continue
		}
		if r, _ := GatewayRejection(g, pool); r != "" {
			continue
		}
		for _, a := range StaticAddresses(g) {
			if a == ip && (first == nil || claimsBefore(g, first)) {
				first = g
			}
		}
	}
	return first
}

// claimsBefore orders claims: the older Gateway first, then by
// namespace/name.
func claimsBefore(a, b *gwv1.Gateway) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}
