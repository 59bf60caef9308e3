package telemetry

import (
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// The names of the workload that opens an HBONE tunnel, in the CONNECT's
// W3C baggage header, as Istio's ztunnel sends them: a proxy that cannot
// read the caller's workload (a waypoint may read only its own namespace's
// and its backends') learns its names from the caller's node proxy. Only
// the proxy sends this header, on the tunnel; a request inside the tunnel
// has baggage of its own, which is the application's and never read here.
const (
	keyCluster   = "k8s.cluster.name"
	keyNamespace = "k8s.namespace.name"
	keyService   = "service.name"    // the canonical service
	keyRevision  = "service.version" // the canonical revision
	keyApp       = "app.name"
	keyVersion   = "app.version"
)

// workloadKeys are the keys that carry the workload's name, one per
// workload type (meshv1.Workload.WorkloadType), as ztunnel reads them.
var workloadKeys = map[string]bool{
	"k8s.deployment.name": true, "k8s.cronjob.name": true, "k8s.job.name": true, "k8s.pod.name": true,
}

// Bounds of a CONNECT's baggage: the names of the longest legitimate one
// (a 253-byte workload name and canonical service, 63-byte labels) take
// under 1 KiB; ztunnel adds the cloud region and zone.
const (
	MaxBaggageBytes   = 2048
	MaxBaggageMembers = 16
)

// Baggage is the baggage header value of the CONNECTs a proxy opens for
// w: its cluster, namespace and names. Empty for a workload without a
// namespace.
func Baggage(w *meshv1.Workload) string {
	if w.GetNamespace() == "" {
		return ""
	}
	var b strings.Builder
	b.Grow(256) // one allocation for the longest usual names
	member := func(k, v string) {
		if v == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	member(keyCluster, Cluster)
	member(keyNamespace, w.GetNamespace())
	if k := "k8s." + w.GetWorkloadType() + ".name"; workloadKeys[k] {
		member(k, w.GetWorkloadName())
	}
	member(keyService, w.GetCanonicalService())
	member(keyRevision, w.GetCanonicalRevision())
	member(keyApp, w.GetApp())
	member(keyVersion, w.GetVersion())
	return b.String()
}

// Names are what a CONNECT's baggage says of its caller ("" where it says
// nothing).
type Names struct {
	Cluster, Namespace, Workload, CanonicalService, CanonicalRevision, App, Version string
}

// ParseBaggage reads the names in a CONNECT's baggage (its baggage
// headers joined by ","). Members of other keys are skipped; a member
// that is no key=value, a known key given twice (or two workload keys), a
// value that is no Kubernetes name or label value where one is expected,
// or more than MaxBaggageBytes or MaxBaggageMembers, make the whole header
// an error: a proxy that sends such a header is not to be believed in
// part.
func ParseBaggage(s string) (Names, error) {
	var n Names
	switch {
	case s == "":
		return n, nil
	case len(s) > MaxBaggageBytes:
		return n, fmt.Errorf("%d bytes, more than %d", len(s), MaxBaggageBytes)
	case strings.Count(s, ",") >= MaxBaggageMembers:
		return n, fmt.Errorf("more than %d members", MaxBaggageMembers)
	}
	seen := map[string]bool{}
	for m := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(m, "=")
		k, v = strings.Trim(k, " \t"), strings.Trim(v, " \t") // W3C's optional white space
		if !ok || k == "" {
			return Names{}, fmt.Errorf("member %q is no key=value", m)
		}
		var field *string
		var valid func(string) bool
		switch {
		case k == keyNamespace:
			field, valid = &n.Namespace, isDNSLabel
		case workloadKeys[k]:
			field, valid, k = &n.Workload, isDNSSubdomain, "workload name"
		case k == keyCluster:
			field, valid = &n.Cluster, isLabelValue
		case k == keyService:
			field, valid = &n.CanonicalService, isLabelValue
		case k == keyRevision:
			field, valid = &n.CanonicalRevision, isLabelValue
		case k == keyApp:
			field, valid = &n.App, isLabelValue
		case k == keyVersion:
			field, valid = &n.Version, isLabelValue
		default:
			continue
		}
		if seen[k] {
			return Names{}, fmt.Errorf("%s given twice", k)
		}
		seen[k] = true
		if v != "" && !valid(v) {
			return Names{}, fmt.Errorf("%s: %q is no valid value", k, v)
		}
		*field = v
	}
	return n, nil
}

func isDNSLabel(s string) bool     { return len(validation.IsDNS1123Label(s)) == 0 }
func isDNSSubdomain(s string) bool { return len(validation.IsDNS1123Subdomain(s)) == 0 }

// isLabelValue reports whether s is a Kubernetes label value, allowing the
// length of a name (a canonical service defaults to the workload's name).
func isLabelValue(s string) bool {
	if len(s) == 0 || len(s) > validation.DNS1123SubdomainMaxLength || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// Reasons a CONNECT's baggage was not believed (BaggageError.Reason).
const (
	BaggageUnauthenticated   = "unauthenticated"    // the tunnel is TLS-only: nobody vouches for it
	BaggageMalformed         = "malformed"          // ParseBaggage refused it
	BaggageNamespaceMismatch = "namespace_mismatch" // it names another namespace than the caller's identity
)

// BaggageError says why a CONNECT's baggage named nobody.
type BaggageError struct {
	Reason string // one of the Baggage* reasons
	Err    error
}

func (e *BaggageError) Error() string { return "baggage ignored: " + e.Reason + ": " + e.Err.Error() }
func (e *BaggageError) Unwrap() error { return e.Err }

// NewBaggageIgnored makes the counter of CONNECT baggage a proxy did not
// believe, by reason (unregistered).
func NewBaggageIgnored() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hbone_baggage_ignored_total",
		Help: "HBONE CONNECTs whose baggage (the caller's workload names) was not believed, by reason: unauthenticated (a TLS-only tunnel), malformed, namespace_mismatch (not the namespace of the caller's identity)."},
		[]string{"reason"})
}

// callerFromBaggage names an authenticated caller of identity id, whom
// the index does not hold, by its CONNECT's baggage: only when the baggage
// is well-formed and its namespace is id's. A node proxy holding a
// certificate of id could name any workload of id's namespace; it cannot
// name one of another.
func callerFromBaggage(id trust.Identity, baggage string) (Peer, error) {
	p := UnknownPeer
	p.Principal, p.Namespace = id.String(), id.Namespace()
	if baggage == "" {
		return p, nil
	}
	n, err := ParseBaggage(baggage)
	if err != nil {
		return p, &BaggageError{Reason: BaggageMalformed, Err: err}
	}
	if n.Namespace != id.Namespace() {
		return p, &BaggageError{Reason: BaggageNamespaceMismatch,
			Err: fmt.Errorf("namespace %q, the caller's identity is %s", n.Namespace, id)}
	}
	p.Workload, p.Cluster = orUnknown(n.Workload), orUnknown(n.Cluster)
	p.CanonicalService, p.CanonicalRevision = orUnknown(n.CanonicalService), orUnknown(n.CanonicalRevision)
	p.App, p.Version = n.App, n.Version
	if p.App == "" {
		p.App = p.CanonicalService
	}
	if p.Version == "" {
		p.Version = p.CanonicalRevision
	}
	return p, nil
}

var errTLSOnly = errors.New("the tunnel presented no identity")
