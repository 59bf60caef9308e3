package telemetry

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/shrinkmap"
)

// Bytes is istio_tcp_received_bytes_total (request bytes: caller to
// destination) and istio_tcp_sent_bytes_total (response bytes), counted as
// they flow, as ztunnel counts them: a scrape adds to the bytes of closed
// connections those the open ones carried so far, read from the counters
// their relays keep anyway. So the relay pays nothing per byte for it, and
// a long-lived connection (a waypoint's pooled one) shows its bytes before
// it ends.
type Bytes struct {
	received, sent *prometheus.Desc

	// mu guards sets and every set's totals and open connections: a
	// connection moves from open to its totals at once, so a scrape
	// counts its bytes once.
	mu   sync.Mutex
	sets map[string]*byteSet // by the label values joined with "\xff"
}

// byteSet is one label set's bytes.
type byteSet struct {
	values         []string
	received, sent int64                               // of its closed connections
	open           shrinkmap.Map[*OpenBytes, struct{}] // a burst's room goes with it
}

// OpenBytes is an open connection of Bytes.
type OpenBytes struct {
	set  *byteSet
	read ByteReader // nil until Follow
}

// ByteReader reads a connection's request and response bytes so far
// (hbone.Progress, *hbone.RelayStream: no allocation to hold either).
type ByteReader interface {
	Bytes() (request, response int64)
}

func newBytes() *Bytes {
	return &Bytes{
		received: prometheus.NewDesc("istio_tcp_received_bytes_total",
			"Bytes of requests: from the caller to the destination, counted as they flow (Istio standard metric).", Labels, nil),
		sent: prometheus.NewDesc("istio_tcp_sent_bytes_total",
			"Bytes of responses: from the destination to the caller, counted as they flow (Istio standard metric).", Labels, nil),
		sets: map[string]*byteSet{},
	}
}

// Open adds a connection whose labels are values (Connection.Values);
// Follow says how to read its bytes, Close ends it.
func (b *Bytes) Open(values []string) *OpenBytes {
	key := strings.Join(values, "\xff")
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sets[key]
	if s == nil {
		s = &byteSet{values: values}
		b.sets[key] = s
	}
	o := &OpenBytes{set: s}
	s.open.Set(o, struct{}{})
	return o
}

// Follow makes scrapes read o's bytes so far from read.
func (b *Bytes) Follow(o *OpenBytes, read ByteReader) {
	b.mu.Lock()
	o.read = read
	b.mu.Unlock()
}

// Close ends o, which carried request and response bytes in all.
func (b *Bytes) Close(o *OpenBytes, request, response int64) {
	b.mu.Lock()
	o.set.open.Delete(o)
	o.set.received += request
	o.set.sent += response
	b.mu.Unlock()
}

func (b *Bytes) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.received
	ch <- b.sent
}

// Collect reads the open connections under the lock, and sends outside
// it: connections open and close meanwhile.
func (b *Bytes) Collect(ch chan<- prometheus.Metric) {
	type totals struct {
		values         []string
		received, sent int64
	}
	b.mu.Lock()
	all := make([]totals, 0, len(b.sets))
	for _, s := range b.sets {
		t := totals{s.values, s.received, s.sent}
		for o := range s.open.Keys() {
			if o.read != nil {
				req, resp := o.read.Bytes()
				t.received, t.sent = t.received+req, t.sent+resp
			}
		}
		all = append(all, t)
	}
	b.mu.Unlock()
	for _, t := range all {
		ch <- prometheus.MustNewConstMetric(b.received, prometheus.CounterValue, float64(t.received), t.values...)
		ch <- prometheus.MustNewConstMetric(b.sent, prometheus.CounterValue, float64(t.sent), t.values...)
	}
}
