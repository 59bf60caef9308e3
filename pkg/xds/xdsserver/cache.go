package xdsserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// entry is one resource as served: marshaled once, versioned by content, so
// an unchanged resource keeps its version across updates and restarts and
// is never sent again.
type entry struct {
	// msg is the message the entry was built from: a set given the same
	// message again (sources reuse the messages of what did not change, and
	// never modify a message once given) reuses the entry unmarshalled.
	msg       proto.Message
	namespace string
	parentNS  []string // a route's parent namespaces other than its own
	owner     string   // meshv1.ResourceOwner: the one identity that reads it, if set
	value     []byte
	version   string
}

// in reports whether the resource belongs to namespace ns: its own, or for a
// consumer route, that of a parent Service.
func (e *entry) in(ns string) bool {
	return e.namespace == ns || slices.Contains(e.parentNS, ns)
}

// deltaCache is the go-control-plane cache behind the delta ADS server: one
// collection per mesh type URL, resources versioned by content hash. It
// differs from LinearCache where the mesh needs it: subscriptions to a
// whole namespace ("<ns>/*"); a requested name that does not exist is
// answered with a removal (the xDS way of saying "does not exist"), so a
// client knows its first sync is complete; and no watch is answered before
// the first configuration is set, so a restarting control plane never tells
// clients to drop what they hold.
//
// A change costs each wildcard subscriber (a node proxy holds every
// workload) the changed names, not the whole collection, and so does its
// acknowledgement: the cache updates the stream's version map in place
// instead of copying it into each response, and remembers per stream and
// type the cache version the map is exact for (current), so that an
// acknowledgement needs no comparison. go-control-plane's Subscription
// says the cache must not alter that map; with its delta server (v0.14,
// server/delta/v3 and server/stream/v3) it is safe: the server hands the
// same map to every watch of the stream (the first request's
// initial_resource_versions, which nothing reads afterwards, or a new
// map), keeps each sent response's NextVersionMap (the same map again) as
// the stream's, and writes the map itself only in
// UpdateResourceSubscriptions, after cancelling the stream's watch; the
// cache writes it only under mu, for a watch open in the cache. So the two
// never touch the map at once (TestConcurrentChangesWhileClientsResubscribe,
// under -race), and nothing is lost when a change answers the watch an
// acknowledgement is about to cancel (TestIncrementalAnswersLoseNothing).
// Re-check both before upgrading go-control-plane.
type deltaCache struct {
	mu      sync.Mutex
	ready   bool
	version uint64
	types   map[string]map[string]*entry
	grants  grants // what each namespace may read outside itself
	watches map[uint64]*deltaWatch
	nextID  uint64
	// current: the wildcard version map of a stream's type holds exactly
	// what its reader may read of the cache version given; nothing newer of
	// that type can differ from the map but the names a later set changes.
	current map[streamType]uint64
}

// streamType names one type of one delta stream.
type streamType struct {
	stream  int64
	typeURL string
}

type deltaWatch struct {
	typeURL string
	req     *cache.DeltaRequest
	sub     cache.Subscription
	ch      chan cache.DeltaResponse
	key     streamType // stream 0: unknown, never current
	// replyEvenIfEmpty: the client waits for an answer (first request of a
	// type, or new names) even if there is nothing to send.
	replyEvenIfEmpty bool
}

var _ cache.Cache = (*deltaCache)(nil)

func newDeltaCache() *deltaCache {
	c := &deltaCache{types: map[string]map[string]*entry{}, watches: map[uint64]*deltaWatch{}, current: map[streamType]uint64{}}
	for _, t := range meshv1.TypeURLs {
		c.types[t] = map[string]*entry{}
	}
	return c
}

// set replaces every collection with the given resources (type URL ->
// name -> message) and answers the watches whose resources changed. Types
// absent from res are emptied. It returns the number of changed resources
// per type.
func (c *deltaCache) set(res map[string]map[string]proto.Message) (map[string]int, error) {
	for typeURL := range res {
		if !knownType(typeURL) {
			return nil, fmt.Errorf("unknown resource type %q", typeURL)
		}
	}
	g := computeGrants(res)
	// Marshal outside the lock: this is the expensive part, and only
	// messages not in the last set need it (an entry is its message's).
	c.mu.Lock()
	prev := c.types
	c.mu.Unlock()
	next := make(map[string]map[string]*entry, len(meshv1.TypeURLs))
	for _, typeURL := range meshv1.TypeURLs {
		entries := make(map[string]*entry, len(res[typeURL]))
		old := prev[typeURL]
		for name, m := range res[typeURL] {
			if o := old[name]; o != nil && o.msg == m {
				entries[name] = o
				continue
			}
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				return nil, fmt.Errorf("marshal %s %s: %w", typeURL, name, err)
			}
			sum := sha256.Sum256(b)
			entries[name] = &entry{msg: m, namespace: meshv1.ResourceNamespace(m), parentNS: meshv1.ParentNamespaces(m), owner: meshv1.ResourceOwner(m),
				value: b, version: hex.EncodeToString(sum[:16])}
		}
		next[typeURL] = entries
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	changed := map[string]int{}
	changedNames := map[string][]string{}
	for typeURL, entries := range next {
		old := c.types[typeURL]
		var names []string
		for name, e := range entries {
			if o, ok := old[name]; !ok || o.version != e.version {
				names = append(names, name)
			}
		}
		for name := range old {
			if _, ok := entries[name]; !ok {
				names = append(names, name)
			}
		}
		if len(names) > 0 {
			changed[typeURL] = len(names)
			changedNames[typeURL] = names
		}
		c.types[typeURL] = entries
	}
	answer := map[string]bool{}
	for t := range changed {
		answer[t] = true
	}
	grantsChanged := !reflect.DeepEqual(g, c.grants)
	if grantsChanged {
		// Who may read which Service and Workload changed: answer those
		// watches again, even if the resources did not change.
		answer[meshv1.ServiceTypeURL], answer[meshv1.WorkloadTypeURL] = true, true
		c.grants = g
	}
	wasReady := c.ready
	c.ready = true
	if len(answer) > 0 || !wasReady {
		prev := c.version
		c.version++
		if wasReady {
			// Streams (with a watch open or a response on its way) whose
			// type did not change stay current.
			for k, v := range c.current {
				if v == prev && !answer[k.typeURL] {
					c.current[k] = c.version
				}
			}
		}
		for id, w := range c.watches {
			if !answer[w.typeURL] && wasReady {
				continue
			}
			var resp cache.DeltaResponse
			if c.currentAt(w, prev) && !grantsChanged {
				resp = c.respondChanged(w, changedNames[w.typeURL])
			} else {
				resp = c.respond(w)
			}
			if resp != nil {
				w.ch <- resp
				delete(c.watches, id)
			}
		}
	}
	return changed, nil
}

// forget drops what the cache knows of a stream that ended.
func (c *deltaCache) forget(stream int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range meshv1.TypeURLs {
		delete(c.current, streamType{stream, t})
	}
}

// CreateDeltaWatch answers at once when the client lacks something, or
// parks the watch until the resources it covers change. The server keeps
// at most one watch per type and stream and drains its response channel
// before opening the next, so the buffered send below never blocks.
func (c *deltaCache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, ch chan cache.DeltaResponse) (func(), error) {
	typeURL := req.GetTypeUrl()
	if !knownType(typeURL) {
		return nil, fmt.Errorf("unknown resource type %q", typeURL)
	}
	w := &deltaWatch{
		typeURL: typeURL, req: req, sub: sub, ch: ch,
		key:              streamType{readerOf(req).stream, typeURL},
		replyEvenIfEmpty: req.GetResponseNonce() == "" || len(req.GetResourceNamesSubscribe()) > 0,
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// An ACK or NACK of a current wildcard stream (the common request)
	// needs no comparison: the client holds what it may read. A request
	// that unsubscribes names may have marked them in the map (the delta
	// server does, for a wildcard), so it is compared in full.
	ack := !w.replyEvenIfEmpty && len(req.GetResourceNamesUnsubscribe()) == 0 && len(req.GetInitialResourceVersions()) == 0
	if c.ready && !(ack && c.currentAt(w, c.version)) {
		if resp := c.respond(w); resp != nil {
			ch <- resp
			return func() {}, nil
		}
	}
	c.nextID++
	id := c.nextID
	c.watches[id] = w
	return func() {
		c.mu.Lock()
		delete(c.watches, id)
		c.mu.Unlock()
	}, nil
}

// currentAt reports whether w's wildcard stream holds exactly what it may
// read of cache version v. Must hold c.mu.
func (c *deltaCache) currentAt(w *deltaWatch, v uint64) bool {
	at, ok := c.current[w.key]
	return ok && at == v && w.key.stream != 0 && w.sub.IsWildcard()
}

// respond computes what the watch's client lacks: resources it does not
// have at their current version, and removals. Must hold c.mu.
func (c *deltaCache) respond(w *deltaWatch) cache.DeltaResponse {
	resources := c.types[w.typeURL]
	// What the reader may not read does not exist for it.
	r := readerOf(w.req)
	readable := func(name string, e *entry) bool { return c.readable(r, w.typeURL, name, e) }
	returned := w.sub.ReturnedResources()
	var next map[string]string
	var updated, removed []string

	if w.sub.IsWildcard() {
		// Lookups only: most watches of a large mesh find nothing to send
		// for most changes, and need no new version map then.
		for name, e := range resources {
			if !readable(name, e) {
				continue
			}
			if v, ok := returned[name]; !ok || v != e.version {
				updated = append(updated, name)
			}
		}
		for name := range returned {
			if e, ok := resources[name]; !ok || !readable(name, e) {
				removed = append(removed, name)
			}
		}
		c.markCurrent(w)
		if len(updated) == 0 && len(removed) == 0 && !w.replyEvenIfEmpty {
			return nil
		}
		next = advance(returned, resources, updated, removed)
	} else {
		delete(c.current, w.key)
		next = map[string]string{}
		want := map[string]bool{}
		for name := range w.sub.SubscribedResources() {
			if ns, ok := strings.CutSuffix(name, xds.NamespaceWildcardSuffix); ok {
				for rn, e := range resources {
					if e.in(ns) && readable(rn, e) {
						want[rn] = true
					}
				}
				continue
			}
			want[name] = true
		}
		for name := range want {
			e, exists := resources[name]
			exists = exists && readable(name, e)
			v, known := returned[name]
			switch {
			case exists:
				next[name] = e.version
				if !known || v != e.version {
					updated = append(updated, name)
				}
			case name == xds.Wildcard:
			case strings.HasSuffix(name, xds.NamespaceWildcardSuffix):
			default:
				// Asked for and absent: say so once (version "" = known absent).
				next[name] = ""
				if !known || v != "" {
					removed = append(removed, name)
				}
			}
		}
		for name, v := range returned {
			if !want[name] && v != "" {
				removed = append(removed, name) // deleted from a namespace subscription
			}
		}
	}
	if len(updated) == 0 && len(removed) == 0 && !w.replyEvenIfEmpty {
		return nil
	}
	return c.response(w, updated, removed, next)
}

// readable reports whether reader r may read resource name of typeURL: a
// resource with an owner (meshv1.ResourceOwner) only its owner, trusted or
// not; any other what is trusted, of its namespace or granted to it. Must
// hold c.mu.
func (c *deltaCache) readable(r reader, typeURL, name string, e *entry) bool {
	if e.owner != "" {
		return r.identity == e.owner
	}
	return r.trusted || e.in(r.namespace) || c.grants.allows(r.namespace, typeURL, name)
}

// respondChanged is respond for a wildcard watch that is current (see
// deltaWatch) as of the version before this one: only the names the last
// set changed can differ.
func (c *deltaCache) respondChanged(w *deltaWatch, names []string) cache.DeltaResponse {
	resources := c.types[w.typeURL]
	r := readerOf(w.req)
	returned := w.sub.ReturnedResources()
	var updated, removed []string
	for _, name := range names {
		e, ok := resources[name]
		readable := ok && c.readable(r, w.typeURL, name, e)
		_, held := returned[name]
		switch {
		case readable:
			updated = append(updated, name)
		case held:
			removed = append(removed, name)
		}
	}
	c.markCurrent(w)
	if len(updated) == 0 && len(removed) == 0 {
		return nil
	}
	return c.response(w, updated, removed, advance(returned, resources, updated, removed))
}

// markCurrent records that w's wildcard stream holds, once the response
// being built reaches it, exactly what it may read of this version. Must
// hold c.mu.
func (c *deltaCache) markCurrent(w *deltaWatch) {
	if w.key.stream != 0 {
		c.current[w.key] = c.version
	}
}

// advance brings a stream's version map to what its client holds once it
// has the updated resources and the removals, in place (see deltaCache:
// the map is the stream's, and the delta server keeps it as the stream's
// map again when it sends the response), and returns it.
func advance(returned map[string]string, resources map[string]*entry, updated, removed []string) map[string]string {
	if returned == nil {
		returned = map[string]string{}
	}
	for _, name := range removed {
		delete(returned, name)
	}
	for _, name := range updated {
		returned[name] = resources[name].version
	}
	return returned
}

// response builds the answer to w. Must hold c.mu.
func (c *deltaCache) response(w *deltaWatch, updated, removed []string, next map[string]string) cache.DeltaResponse {
	resources := c.types[w.typeURL]
	sort.Strings(updated)
	sort.Strings(removed)
	out := &discovery.DeltaDiscoveryResponse{
		TypeUrl:           w.typeURL,
		SystemVersionInfo: strconv.FormatUint(c.version, 10),
		RemovedResources:  removed,
	}
	for _, name := range updated {
		e := resources[name]
		out.Resources = append(out.Resources, &discovery.Resource{
			Name:     name,
			Version:  e.version,
			Resource: &anypb.Any{TypeUrl: w.typeURL, Value: e.value},
		})
	}
	return &cache.DeltaPassthroughResponse{DeltaRequest: w.req, NextVersionMap: next, DeltaDiscoveryResponse: out}
}

func knownType(typeURL string) bool {
	_, err := meshv1.NewResource(typeURL)
	return err == nil
}

// currentVersion is the version responses are sent with now.
func (c *deltaCache) currentVersion() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strconv.FormatUint(c.version, 10)
}

// resourceCounts returns the number of resources per type.
func (c *deltaCache) resourceCounts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.types))
	for t, r := range c.types {
		out[t] = len(r)
	}
	return out
}

var errSotW = errors.New("only delta xDS is served")

// CreateWatch implements cache.Cache; state-of-the-world xDS is not served.
func (c *deltaCache) CreateWatch(*cache.Request, cache.Subscription, chan cache.Response) (func(), error) {
	return nil, errSotW
}

// Fetch implements cache.Cache; REST xDS is not served.
func (c *deltaCache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, errSotW
}
