package policy

import (
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// A decisionCache reuses a policy set's results for requests whose inputs
// agree on everything the policy can read.
//
// Evaluating a compiled policy set is a function of its input, its data
// (fixed per set: a new set gets a new cache) and the built-ins it calls.
// Every read of the input goes through a reference rooted at input, so the
// policy can only see the values at the constant prefixes of those
// references (input.parsed_path[0], or input.attributes.request.http.headers
// for headers[name]); two inputs with equal values there evaluate alike.
// A set is not cached when that argument does not hold: a reference to
// input as a whole (or one whose first step is not constant), a call of a
// nondeterministic built-in (time.now_ns, http.send, rand.intn, ...) or of
// one that reads the clock without being marked so (x509 verification),
// or print (its output would only appear on misses). Entries also expire
// after decisionCacheTTL, a bound on any time dependence missed anyway.
//
// The key encodes each read value exactly, so only identical values share
// a result (1 and 1.0 do not). Evaluation errors (timeouts included) are
// never cached. The table is direct-mapped and fixed-size:
// bounded memory, no locks; a collision just evaluates again.
//
// By the same argument a miss is evaluated on a pruned input that holds
// only the values at those paths (prune): the policy cannot tell it from
// the whole input, and it is much cheaper to build than the whole input.
type decisionCache struct {
	// what the policy reads, relative to input (shortest prefixes only),
	// resolved against the input schema
	lookups []inputLookup
	pruned  []ast.Ref // paths cut before their first step that is not a string
	seed    maphash.Seed
	slots   [decisionCacheSlots]atomic.Pointer[cachedResult]
}

type cachedResult struct {
	key     string
	rs      rego.ResultSet // read only: shared by every request that hits
	d       Decision       // rs read; its maps and lists are shared with every hit too
	expires int64          // unix nanoseconds
}

// decided is r's decision. Its header maps and lists are shared by every
// hit (Decision says callers only read them): a copy per hit was ~2 % of
// the waypoint's CPU.
func (r *cachedResult) decided() Decision { return r.d }

const (
	decisionCacheSlots = 4096
	decisionCacheTTL   = time.Second
	// maxCacheKey bounds an entry: a policy that reads large parts of the
	// input (all headers) is evaluated every time for requests with more.
	maxCacheKey = 4096
)

// clockBuiltins read the current time but are not marked nondeterministic.
var clockBuiltins = map[string]bool{
	"crypto.x509.parse_and_verify_certificates":              true,
	"crypto.x509.parse_and_verify_certificates_with_options": true,
}

// DecisionCacheStatus says whether the active policy's decisions are reused
// (admin /config_dump "policies").
type DecisionCacheStatus struct {
	Enabled bool `json:"enabled"`
	// Reason says why not, when disabled.
	Reason string `json:"reason,omitempty"`
	// InputPaths are the parts of the input a decision is keyed on.
	InputPaths []string `json:"input_paths,omitempty"`
}

// newDecisionCache analyses the compiled modules of a set. It returns nil
// and the reason when the set's results must not be reused.
func newDecisionCache(modules map[string]*ast.Module) (*decisionCache, string) {
	var paths []ast.Ref
	reason := ""
	var vis *ast.GenericVisitor
	vis = ast.NewGenericVisitor(func(x any) bool {
		if reason != "" {
			return true
		}
		switch x := x.(type) {
		case *ast.Import:
			// Compiling resolved every use of an import to the full
			// reference; the import itself reads nothing.
			return true
		case ast.Ref:
			if !x.HasPrefix(ast.InputRootRef) {
				return false
			}
			p := constantPrefix(x)
			if len(p) == 1 {
				reason = "the policy reads input as a whole (" + x.String() + ")"
				return true
			}
			paths = append(paths, p[1:])
			// Variable parts of the reference are read too: input.a[input.b].
			for _, t := range x[1:] {
				vis.Walk(t)
			}
			return true
		case ast.Var:
			if x.Equal(ast.InputRootDocument.Value) {
				reason = "the policy uses input as a value"
				return true
			}
		case *ast.Head:
			// Rule references (p.q[x]) are not walked by the visitor.
			for _, t := range x.Reference {
				vis.Walk(t)
			}
		case *ast.Expr:
			if x.IsCall() {
				reason = callReason(x.Operator())
			}
		case ast.Call:
			if op, ok := x[0].Value.(ast.Ref); ok {
				reason = callReason(op)
			}
		}
		return reason != ""
	})
	names := make([]string, 0, len(modules))
	for name := range modules {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		vis.Walk(modules[name])
		if reason != "" {
			return nil, reason
		}
	}
	kept := shortestPrefixes(paths)
	// Pruning keeps arrays (and anything reached by a number) whole.
	var cut []ast.Ref
	for _, p := range kept {
		n := 0
		for n < len(p) {
			if _, ok := p[n].Value.(ast.String); !ok {
				break
			}
			n++
		}
		if n == 0 {
			// input[0]: a number as the first step reads nothing a pruned
			// input could hold; keep the whole input to be safe.
			return &decisionCache{lookups: resolveAll(kept), seed: maphash.MakeSeed()}, ""
		}
		cut = append(cut, p[:n].Copy())
	}
	return &decisionCache{lookups: resolveAll(kept), pruned: shortestPrefixes(cut), seed: maphash.MakeSeed()}, ""
}

// shortestPrefixes sorts paths and drops those that extend another: a value
// includes everything below it.
func shortestPrefixes(paths []ast.Ref) []ast.Ref {
	slices.SortFunc(paths, func(a, b ast.Ref) int { return a.Compare(b) })
	kept := paths[:0]
	for _, p := range paths {
		if n := len(kept); n > 0 && p.HasPrefix(kept[n-1]) {
			continue
		}
		kept = append(kept, p)
	}
	return kept
}

// prune builds the input the policy is evaluated on after a miss: the value
// of input at each pruned path, inside the objects that lead to it, and
// nothing else. nil when the whole input must be used.
func (c *decisionCache) prune(input policyInput) ast.Value {
	if c.pruned == nil {
		return nil
	}
	root := ast.NewObject()
	for _, p := range c.pruned {
		v, found := input.find(p)
		if !found {
			continue
		}
		obj := root
		for _, step := range p[:len(p)-1] {
			next := obj.Get(step)
			if next == nil {
				next = ast.NewTerm(ast.NewObject())
				obj.Insert(step, next)
			}
			o, ok := next.Value.(ast.Object)
			if !ok {
				return nil // cannot happen with shortest prefixes; evaluate it all
			}
			obj = o
		}
		obj.Insert(p[len(p)-1], ast.NewTerm(v))
	}
	return root
}

// constantPrefix is the leading part of ref made of strings and numbers:
// where the value the reference reads is fixed, whatever the variables.
func constantPrefix(ref ast.Ref) ast.Ref {
	for i := 1; i < len(ref); i++ {
		switch ref[i].Value.(type) {
		case ast.String, ast.Number:
		default:
			return ref[:i]
		}
	}
	return ref
}

// callReason is why calling op rules the cache out, "" when it does not.
func callReason(op ast.Ref) string {
	name := op.String()
	switch {
	case name == "print" || name == "internal.print" || name == "trace":
		return "the policy calls " + name
	case clockBuiltins[name]:
		return "the policy calls " + name + ", which reads the clock"
	}
	if b, ok := ast.BuiltinMap[name]; ok && b.Nondeterministic {
		return "the policy calls the nondeterministic built-in " + name
	}
	return ""
}

func (c *decisionCache) status() DecisionCacheStatus {
	st := DecisionCacheStatus{Enabled: true}
	for _, l := range c.lookups {
		st.InputPaths = append(st.InputPaths, ast.InputRootRef.Concat(l.path).String())
	}
	return st
}

// key appends to b an exact encoding of each value the policy can read: a
// string as "s", its length, ":" and its bytes; an array of strings (a
// parsed path) as "a", its length, ":" and its strings so; anything else as
// "v" and its Rego text (which quotes the strings inside); a missing value
// as "\x01"; each followed by "\x00". False when the input is too large to
// cache.
func (c *decisionCache) key(b []byte, input policyInput) ([]byte, bool) {
	for i := range c.lookups {
		b = input.appendKey(b, &c.lookups[i])
		b = append(b, 0)
		if len(b) > maxCacheKey {
			return b, false
		}
	}
	return b, true
}

// appendKeyValue appends the encoding of v (found false: missing).
func appendKeyValue(b []byte, v ast.Value, found bool) []byte {
	if !found {
		return append(b, 1)
	}
	switch v := v.(type) {
	case ast.String:
		return appendKeyString(b, string(v))
	case *ast.Array:
		strs := true
		for i := range v.Len() {
			if _, ok := v.Elem(i).Value.(ast.String); !ok {
				strs = false
				break
			}
		}
		if strs {
			b = append(b, 'a')
			b = strconv.AppendInt(b, int64(v.Len()), 10)
			b = append(b, ':')
			for i := range v.Len() {
				b = appendKeyString(b, string(v.Elem(i).Value.(ast.String)))
			}
			return b
		}
	}
	b = append(b, 'v')
	return append(b, v.String()...)
}

func appendKeyString(b []byte, s string) []byte {
	b = append(b, 's')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// keyBufs recycles the buffers keys are built in: a hit only compares the
// key, so only a miss makes it a string.
var keyBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, 512)
	return &b
}}

func (c *decisionCache) slot(key []byte) *atomic.Pointer[cachedResult] {
	return &c.slots[maphash.Bytes(c.seed, key)%decisionCacheSlots]
}

func (c *decisionCache) get(key []byte, now time.Time) (*cachedResult, bool) {
	e := c.slot(key).Load()
	if e == nil || e.key != string(key) || now.UnixNano() >= e.expires {
		return nil, false
	}
	return e, true
}

// put keeps rs, and d as read from it, for key.
func (c *decisionCache) put(key []byte, rs rego.ResultSet, d Decision, now time.Time) {
	c.slot(key).Store(&cachedResult{key: string(key), rs: rs, d: d, expires: now.Add(decisionCacheTTL).UnixNano()})
}
