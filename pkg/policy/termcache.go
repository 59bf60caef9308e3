package policy

import (
	"hash/maphash"
	"net/netip"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
)

// termCache remembers recently built input terms (addresses, principals)
// that recur across requests. It is direct-mapped and fixed-size: bounded
// memory, no locks, and a miss just builds the term again. Sharing terms
// between inputs is safe because evaluation never changes its input.
type termCache[K comparable] struct {
	seed  maphash.Seed
	slots [256]atomic.Pointer[termEntry[K]]
	build func(K) *ast.Term
}

type termEntry[K comparable] struct {
	key  K
	term *ast.Term
}

func newTermCache[K comparable](build func(K) *ast.Term) *termCache[K] {
	return &termCache[K]{seed: maphash.MakeSeed(), build: build}
}

func (c *termCache[K]) get(k K) *ast.Term {
	slot := &c.slots[maphash.Comparable(c.seed, k)%uint64(len(c.slots))]
	if e := slot.Load(); e != nil && e.key == k {
		return e.term
	}
	t := c.build(k)
	slot.Store(&termEntry[K]{key: k, term: t})
	return t
}

var (
	addressTerms   = newTermCache(buildSocketAddress)
	principalTerms = newTermCache(func(id string) *ast.Term { return ast.StringTerm(id) })
	peerTerms      = newTermCache(buildPeer)
)

// peerKey is what attributes.source or attributes.destination holds: an
// address and, only when authenticated (source) or known (destination), a
// principal. The principal comes from the caller of BuildInput, never from
// the cache: a key with no principal can only map to an object without one.
type peerKey struct {
	addr      netip.AddrPort
	principal string
}

func buildPeer(k peerKey) *ast.Term {
	obj := ast.NewObjectWithCapacity(2)
	if a := socketAddress(k.addr); a != nil {
		obj.Insert(kAddress, a)
	}
	if k.principal != "" {
		obj.Insert(kPrincipal, principalTerms.get(k.principal))
	}
	return ast.NewTerm(obj)
}

// socketAddress renders {"socketAddress": {"address", "portValue"}}; nil for
// an unknown address. A zero port is left out, as protobuf JSON omits it.
func socketAddress(ap netip.AddrPort) *ast.Term {
	if !ap.IsValid() {
		return nil
	}
	return addressTerms.get(ap)
}

func buildSocketAddress(ap netip.AddrPort) *ast.Term {
	sa := ast.NewObject([2]*ast.Term{kAddress, ast.StringTerm(ap.Addr().Unmap().String())})
	if ap.Port() != 0 {
		sa.Insert(kPortValue, ast.InternedTerm(int(ap.Port())))
	}
	return ast.ObjectTerm([2]*ast.Term{kSocketAddress, ast.NewTerm(sa)})
}
