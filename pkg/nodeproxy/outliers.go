package nodeproxy

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Ejection of hops that cannot be dialled: the first ejection lasts
// baseEjection, each further consecutive one twice as long, up to
// maxEjection (Envoy's outlier detection grows its ejections the same
// way, from 30 s; connections here are cheaper to retry).
const (
	baseEjection = 5 * time.Second
	maxEjection  = time.Minute
)

// outliers are the hops (waypoint replicas, endpoints) whose last dial
// failed: a dead one that the configuration still lists would otherwise be
// tried first by a share of the connections, each paying a failed dial (up
// to the connect timeout against an address that does not answer) before
// falling through. An ejected hop is tried last, never skipped: when every
// hop is ejected the connection still tries them all.
type outliers struct {
	mu  sync.Mutex
	m   map[netip.AddrPort]ejection
	now func() time.Time
}

type ejection struct {
	until    time.Time
	failures int // consecutive
}

func newOutliers() *outliers {
	return &outliers{m: map[netip.AddrPort]ejection{}, now: time.Now}
}

// dialFailed reports whether err says that the hop could not be reached
// (its TCP dial failed): then it, and not the source (its certificate) or
// the answer of a reachable peer, is at fault.
func dialFailed(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// failed ejects a, longer for each failure since its last success, and
// returns for how long and whether it was in the rotation until now.
func (o *outliers) failed(a netip.AddrPort) (time.Duration, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	// Forget hops whose ejection ended over maxEjection ago: pod addresses
	// come and go, and one the configuration dropped never succeeds again,
	// so without this the map would only grow. Dial failures are rare
	// enough for the sweep to run on each.
	for k, e := range o.m {
		if now.Sub(e.until) > maxEjection {
			delete(o.m, k)
		}
	}
	e := o.m[a]
	fresh := !now.Before(e.until)
	e.failures++
	d := maxEjection
	if e.failures <= 4 { // 5 s << 4 is past the cap
		d = min(baseEjection<<(e.failures-1), maxEjection)
	}
	e.until = now.Add(d)
	o.m[a] = e
	return d, fresh
}

// succeeded returns a to the rotation.
func (o *outliers) succeeded(a netip.AddrPort) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, a)
}

// ejected reports whether a is ejected now.
func (o *outliers) ejected(a netip.AddrPort) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.m[a]
	return ok && o.now().Before(e.until)
}
