// Package connpolicy enforces ConnectionPolicies (docs/design.md §7):
// Rego policy sets the control plane compiled, tested and sent over xDS
// with the policies that name them, evaluated once per connection by the
// destination's node proxy (for the workloads a policy selects) or by a
// waypoint (for the tunnels of the Gateways a policy targets), before any
// byte of the connection is relayed or parsed.
//
// Every policy that selects a connection must allow it, as every ext_authz
// filter of an Envoy chain must; a connection no policy selects is allowed.
// A policy that cannot be enforced (its set is unknown, has no active
// revision or does not compile here) denies everything it selects, and so
// does an evaluation error: nothing fails open.
package connpolicy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Options configure an Enforcer.
type Options struct {
	// Logger receives installs, rejections and evaluation errors.
	Logger *zap.Logger
	// DecisionLog receives every decision (mode as the set's settings say).
	DecisionLog *policy.DecisionLogger
	// Registerer, if set, registers connection_policy_decisions_total.
	Registerer prometheus.Registerer
}

// Enforcer holds the policies in force. Update replaces them; Current is
// safe for concurrent use.
type Enforcer struct {
	opts      Options
	log       *zap.Logger
	decisions *prometheus.CounterVec

	mu  sync.Mutex // serializes Update
	cur atomic.Pointer[Table]
}

// Table is one immutable set of policies in force.
type Table struct {
	byNamespace map[string][]*Policy // sorted by name
}

// Policy is one ConnectionPolicy, ready to evaluate.
type Policy struct {
	Name     string // "<namespace>/<name>"
	Revision string // the policy set's
	res      *meshv1.ConnectionPolicy
	engine   *policy.Engine // nil: invalid
	invalid  string
}

// New builds an enforcer with no policies.
func New(o Options) (*Enforcer, error) {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	e := &Enforcer{opts: o, log: o.Logger.Named("connection-policy"),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "connection_policy_decisions_total",
			Help: "Connection policy decisions by policy (<namespace>/<name>) and result: allow, deny (the policy said no or nothing), error (evaluation failed or the policy cannot be enforced; denied), recheck_deny (an open connection closed after a change).",
		}, []string{"policy", "result"})}
	if o.Registerer != nil {
		if err := o.Registerer.Register(e.decisions); err != nil {
			return nil, fmt.Errorf("connection policy metrics: %w", err)
		}
	}
	e.cur.Store(&Table{byNamespace: map[string][]*Policy{}})
	return e, nil
}

// Current is the table in force.
func (e *Enforcer) Current() *Table { return e.cur.Load() }

// Update installs policies, reusing the compiled set of any policy whose
// set and revision are unchanged; it compiles new ones off the connection
// path. It reports whether anything changed.
func (e *Enforcer) Update(ctx context.Context, policies []*meshv1.ConnectionPolicy) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	prev := e.cur.Load()
	engines := map[string]*policy.Engine{} // "<set>@<revision>" -> engine, reused from prev
	for _, list := range prev.byNamespace {
		for _, p := range list {
			if p.engine != nil {
				engines[p.res.GetPolicy()+"@"+p.Revision] = p.engine
			}
		}
	}
	next := &Table{byNamespace: map[string][]*Policy{}}
	for _, r := range policies {
		p := &Policy{Name: r.GetNamespace() + "/" + r.GetName(), Revision: r.GetRevision(), res: r, invalid: r.GetInvalidReason()}
		if p.invalid == "" {
			key := r.GetPolicy() + "@" + r.GetRevision()
			eng, ok := engines[key]
			if !ok {
				var err error
				eng, err = policy.NewInstalledEngine(ctx, contentOf(r), policy.Options{
					// The control plane ran the set's tests before sending it.
					SkipTests:   true,
					Logger:      e.log.With(zap.String("policy_set", r.GetPolicy())),
					DecisionLog: e.opts.DecisionLog,
				})
				if err != nil {
					p.invalid = "policy set " + r.GetPolicy() + " revision " + r.GetRevision() + ": " + err.Error()
					e.log.Error("connection policy cannot be enforced; it denies what it selects", zap.String("policy", p.Name), zap.String("reason", p.invalid))
				} else {
					engines[key] = eng
					e.log.Info("connection policy set installed", zap.String("policy_set", r.GetPolicy()), zap.String("revision", r.GetRevision()))
				}
			}
			if p.invalid == "" {
				p.engine = eng
			}
		}
		next.byNamespace[r.GetNamespace()] = append(next.byNamespace[r.GetNamespace()], p)
	}
	for _, list := range next.byNamespace {
		sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	}
	changed := !sameTable(prev, next)
	if changed {
		e.cur.Store(next)
	}
	return changed
}

// Sources is a policy set's content as a ConnectionPolicy carries it (the
// control plane's side of contentOf).
func Sources(c *policy.Content) []*meshv1.PolicySource {
	var out []*meshv1.PolicySource
	for _, s := range c.Sources {
		src := &meshv1.PolicySource{Name: s.Name, Revision: s.Revision, Digest: s.Digest}
		for _, f := range s.Files {
			src.Files = append(src.Files, &meshv1.PolicyFile{Path: f.Path, Content: f.Content})
		}
		out = append(out, src)
	}
	return out
}

func contentOf(r *meshv1.ConnectionPolicy) *policy.Content {
	c := &policy.Content{Revision: r.GetRevision()}
	for _, s := range r.GetSources() {
		cs := policy.ContentSource{Name: s.GetName(), Revision: s.GetRevision(), Digest: s.GetDigest()}
		for _, f := range s.GetFiles() {
			cs.Files = append(cs.Files, policy.File{Path: f.GetPath(), Content: f.GetContent()})
		}
		c.Sources = append(c.Sources, cs)
	}
	return c
}

// sameTable: the same policies, selecting the same, at the same revisions.
func sameTable(a, b *Table) bool {
	if len(a.byNamespace) != len(b.byNamespace) {
		return false
	}
	for ns, la := range a.byNamespace {
		lb := b.byNamespace[ns]
		if len(la) != len(lb) {
			return false
		}
		for i := range la {
			x, y := la[i], lb[i]
			if x.Name != y.Name || x.Revision != y.Revision || x.invalid != y.invalid ||
				!maps.Equal(x.res.GetSelector(), y.res.GetSelector()) || !slices.Equal(x.res.GetTargetGateways(), y.res.GetTargetGateways()) {
				return false
			}
		}
	}
	return true
}

// ForWorkload lists the policies that select a workload: those of its
// namespace that target no Gateway and whose selector its labels satisfy.
// A refused policy with both a selector and Gateways selects by both.
func (t *Table) ForWorkload(w *meshv1.Workload) []*Policy {
	var out []*Policy
	for _, p := range t.byNamespace[w.GetNamespace()] {
		if len(p.res.GetTargetGateways()) > 0 && len(p.res.GetSelector()) == 0 {
			continue
		}
		if matches(p.res.GetSelector(), w.GetLabels()) {
			out = append(out, p)
		}
	}
	return out
}

// ForWaypoint lists the policies that target the waypoint namespace/name.
func (t *Table) ForWaypoint(namespace, name string) []*Policy {
	var out []*Policy
	for _, p := range t.byNamespace[namespace] {
		if slices.Contains(p.res.GetTargetGateways(), name) {
			out = append(out, p)
		}
	}
	return out
}

func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Verdict is the outcome of a connection's policies.
type Verdict struct {
	Allowed bool
	// Policy and Revision name the policy that denied (the last evaluated
	// when all allowed; "" when none selects the connection).
	Policy, Revision string
	// DecisionID is that decision's id in the decision log ("" for a
	// policy that cannot be enforced).
	DecisionID string
	Reason     string
}

// Authorize evaluates every policy in order; the first that does not
// allow decides.
func (e *Enforcer) Authorize(ctx context.Context, policies []*Policy, req *policy.ConnectionRequest) Verdict {
	return e.authorize(ctx, policies, req, false)
}

// Recheck is Authorize for a connection already open: its denials count
// as recheck_deny, its allows are not counted again.
func (e *Enforcer) Recheck(ctx context.Context, policies []*Policy, req *policy.ConnectionRequest) Verdict {
	return e.authorize(ctx, policies, req, true)
}

func (e *Enforcer) authorize(ctx context.Context, policies []*Policy, req *policy.ConnectionRequest, recheck bool) Verdict {
	v := Verdict{Allowed: true}
	for _, p := range policies {
		v.Policy, v.Revision = p.Name, p.Revision
		if p.engine == nil {
			e.decisions.WithLabelValues(p.Name, "error").Inc()
			return Verdict{Policy: p.Name, Revision: p.Revision, Reason: "policy " + p.Name + " cannot be enforced: " + p.invalid}
		}
		d := p.engine.DecideConnection(ctx, req)
		v.DecisionID = d.ID
		if !d.Allowed {
			result := "deny"
			if recheck {
				result = "recheck_deny"
			}
			if d.Status >= 500 {
				result = "error"
			}
			e.decisions.WithLabelValues(p.Name, result).Inc()
			v.Allowed, v.Reason = false, fmt.Sprintf("denied by connection policy %s (revision %s): %s", p.Name, p.Revision, d.Reason)
			return v
		}
		if !recheck {
			e.decisions.WithLabelValues(p.Name, "allow").Inc()
		}
	}
	return v
}
