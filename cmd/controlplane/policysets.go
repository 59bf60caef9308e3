package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/connpolicy"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/policy/policybundle"
	"github.com/causeway-mesh/causeway/pkg/policy/policygit"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// policySetFlag is one --connection-policy NAME=SOURCE.
type policySetFlag struct {
	name string
	opts policy.Options // the source only
}

// parsePolicySet reads NAME=dir:PATH, NAME=git:URL[#REF[:DIR]] or
// NAME=bundle:SERVICE_URL#RESOURCE.
func parsePolicySet(spec string) (policySetFlag, error) {
	name, src, ok := strings.Cut(spec, "=")
	if !ok || name == "" || src == "" {
		return policySetFlag{}, fmt.Errorf("%q: want NAME=dir:PATH, NAME=git:URL[#REF[:DIR]] or NAME=bundle:URL#RESOURCE", spec)
	}
	kind, loc, _ := strings.Cut(src, ":")
	f := policySetFlag{name: name}
	switch kind {
	case "dir":
		if loc == "" {
			return f, fmt.Errorf("%q: empty directory", spec)
		}
		f.opts.Dir = loc
	case "git":
		url, refDir, _ := strings.Cut(loc, "#")
		ref, dir, _ := strings.Cut(refDir, ":")
		if url == "" {
			return f, fmt.Errorf("%q: empty repository URL", spec)
		}
		g, err := policygit.New(policygit.Options{URL: url, Ref: ref, Dir: dir}, policy.Limits{})
		if err != nil {
			return f, fmt.Errorf("%q: %w", spec, err)
		}
		f.opts.Remote = g
	case "bundle":
		url, resource, _ := strings.Cut(loc, "#")
		if url == "" || resource == "" {
			return f, fmt.Errorf("%q: want bundle:SERVICE_URL#RESOURCE", spec)
		}
		service, err := json.Marshal(map[string]string{"url": url})
		if err != nil {
			return f, err
		}
		if f.opts.Feed, err = policybundle.New(policybundle.Options{Name: name, Service: service, Resource: resource}); err != nil {
			return f, err
		}
	default:
		return f, fmt.Errorf("%q: unknown source kind %q (dir, git or bundle)", spec, kind)
	}
	return f, nil
}

// policySets are the connection policy sets (--connection-policy), each
// read, compiled and tested here by its own engine, exactly as a waypoint
// treats its policy (a set that fails stays at its last good revision).
// ConnectionPolicies name a set; its active files travel with them over
// xDS, so node proxies never read policy sources themselves.
type policySets struct {
	log     *zap.Logger
	engines map[string]*policy.Engine
	polled  map[string]bool // sets with a directory or Git source

	mu      sync.Mutex
	content map[string]*config.PolicyContent // by set name, of the revision last converted
}

func newPolicySets(flags []policySetFlag, log *zap.Logger, changed func()) (*policySets, error) {
	ps := &policySets{log: log.Named("connection-policy"), engines: map[string]*policy.Engine{}, polled: map[string]bool{}, content: map[string]*config.PolicyContent{}}
	for _, f := range flags {
		if _, dup := ps.engines[f.name]; dup {
			return nil, fmt.Errorf("--connection-policy %s given twice", f.name)
		}
		o := f.opts
		// An optional ConfigMap that does not exist is an empty directory:
		// the documented default, not an error.
		o.EmptyDirIsAbsent = true
		o.Logger = ps.log.With(zap.String("policy_set", f.name))
		o.OnActivate = func(string) { changed() }
		e, err := policy.NewEngine(o)
		if err != nil {
			return nil, fmt.Errorf("--connection-policy %s: %w", f.name, err)
		}
		ps.engines[f.name] = e
		ps.polled[f.name] = o.Dir != "" || o.Remote != nil
	}
	return ps, nil
}

// run keeps every set current until ctx ends.
func (ps *policySets) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, e := range ps.engines {
		wg.Go(func() { _ = e.Run(ctx) })
	}
	wg.Wait()
}

// attach returns p with its set's active files, or p denying with the
// reason it cannot be enforced.
func (ps *policySets) attach(p *meshv1.ConnectionPolicy) *meshv1.ConnectionPolicy {
	e, ok := ps.engines[p.GetPolicy()]
	if !ok {
		q := proto.CloneOf(p)
		q.InvalidReason = notLoaded(p.GetPolicy())
		return q
	}
	return config.AttachPolicy(p, ps.contentOf(p.GetPolicy(), e))
}

func notLoaded(set string) string {
	return fmt.Sprintf("the control plane loads no policy set %q (--connection-policy %s=SOURCE)", set, set)
}

// state says whether set can be enforced: its active revision, or why not
// (for the ConnectionPolicies' status).
func (ps *policySets) state(set string) (revision, problem string) {
	e, ok := ps.engines[set]
	if !ok {
		return "", notLoaded(set)
	}
	if rev := e.Revision(); rev != "" {
		return rev, ""
	}
	problem = fmt.Sprintf("policy set %q has no good revision at the control plane", set)
	if r := e.Status().LastRejection; r != nil {
		problem += ": " + r.Reason
	}
	return "", problem
}

// contentOf converts a set's active content once per revision.
func (ps *policySets) contentOf(name string, e *policy.Engine) *config.PolicyContent {
	rev := e.Revision()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if c := ps.content[name]; c != nil && c.Revision == rev {
		return c
	}
	content := e.Content()
	if content == nil {
		return nil
	}
	out := &config.PolicyContent{Revision: content.Revision, Sources: connpolicy.Sources(content)}
	ps.content[name] = out
	return out
}

// status is each set's state, for /debug/config.
func (ps *policySets) status() map[string]policy.Status {
	out := make(map[string]policy.Status, len(ps.engines))
	names := make([]string, 0, len(ps.engines))
	for n := range ps.engines {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		out[n] = ps.engines[n].Status()
	}
	return out
}

// loadAll reads every directory or Git set once, within timeout, so the
// first configuration served carries their files where they are good.
func (ps *policySets) loadAll(ctx context.Context, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var wg sync.WaitGroup
	for name, e := range ps.engines {
		if !ps.polled[name] {
			continue // a bundle arrives when its service answers
		}
		wg.Go(func() {
			if err := e.Load(ctx); err != nil && !errors.Is(err, policy.ErrEmptySource) {
				ps.log.Warn("connection policy set not active yet; the policies naming it deny", zap.String("policy_set", name), zap.Error(err))
			}
		})
	}
	wg.Wait()
}
