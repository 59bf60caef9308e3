package policy

import (
	"hash/maphash"
	"net/netip"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
)

// termCache remembers recently built input terms (addresses, principals,
// parsed paths) that recur across requests. It is direct-mapped and
// fixed-size: bounded memory, no locks, and a miss just builds the term
// again. Sharing terms between inputs is safe because evaluation never
// changes its input.
type termCache[K comparable, V any] struct {
	seed  maphash.Seed
	slots [256]atomic.Pointer[termEntry[K, V]]
	build func(K) V
}

type termEntry[K comparable, V any] struct {
	key   K
	value V
}

func newTermCache[K comparable, V any](build func(K) V) *termCache[K, V] {
	return &termCache[K, V]{seed: maphash.MakeSeed(), build: build}
}

func (c *termCache[K, V]) get(k K) V {
	slot := &c.slots[maphash.Comparable(c.seed, k)%uint64(len(c.slots))]
	if e := slot.Load(); e != nil && e.key == k {
		return e.value
	}
	v := c.build(k)
	slot.Store(&termEntry[K, V]{key: k, value: v})
	return v
}

var (
	addressTerms   = newTermCache(buildSocketAddress)
	principalTerms = newTermCache(func(id string) *ast.Term { return ast.StringTerm(id) })
	peerTerms      = newTermCache(buildPeer)
	pathTerms      = newTermCache(buildPathTerms)
)

// maxCachedPath bounds the request targets pathTerms keeps: longer ones
// are parsed every time rather than held.
const maxCachedPath = 512

// pathParts is a request target's :path term and its parsed_path and
// parsed_query terms, or why it cannot be parsed.
type pathParts struct {
	path, parsedPath, parsedQuery *ast.Term
	err                           error
}

func buildPathTerms(target string) pathParts {
	parsedPath, parsedQuery, err := parsePathAndQuery(target)
	if err != nil {
		return pathParts{err: err}
	}
	return pathParts{path: ast.StringTerm(target), parsedPath: parsedPath, parsedQuery: parsedQuery}
}

// pathTermsFor returns the parts of target, from the cache when it is short.
func pathTermsFor(target string) pathParts {
	if len(target) > maxCachedPath {
		return buildPathTerms(target)
	}
	return pathTerms.get(target)
}

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
