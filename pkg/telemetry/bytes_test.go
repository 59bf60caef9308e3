package telemetry

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/causeway-mesh/causeway/pkg/shrinkmap"
)

// fixedBytes is a connection that carried a fixed count so far.
type fixedBytes struct{ req, resp int64 }

func (f fixedBytes) Bytes() (int64, int64) { return f.req, f.resp }

// After a burst of connections of one label set closes, the set gives the
// burst's room back, and a scrape still counts every byte once.
func TestBytesGiveBackABurst(t *testing.T) {
	b := newBytes()
	values := make([]string, len(Labels))
	for i := range values {
		values[i] = "v"
	}
	const burst, kept = 4 * shrinkmap.ShrinkMin, 3
	open := make([]*OpenBytes, burst)
	for i := range open {
		open[i] = b.Open(values)
		b.Follow(open[i], fixedBytes{1, 2})
	}
	for _, o := range open[kept:] {
		b.Close(o, 10, 20)
	}
	set := open[0].set
	if n, peak := set.open.Len(), set.open.Peak(); n != kept || peak >= shrinkmap.ShrinkMin {
		t.Fatalf("%d connections open, room for %d kept after a burst of %d", n, peak, burst)
	}
	closed := int64(burst - kept)
	want := map[string]float64{
		"istio_tcp_received_bytes_total": float64(closed*10 + kept*1),
		"istio_tcp_sent_bytes_total":     float64(closed*20 + kept*2),
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(b)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if len(f.Metric) != 1 || f.GetType() != dto.MetricType_COUNTER {
			t.Fatalf("%s: %d series of type %v, want one counter", f.GetName(), len(f.Metric), f.GetType())
		}
		if got := f.Metric[0].GetCounter().GetValue(); got != want[f.GetName()] {
			t.Errorf("%s = %v, want %v", f.GetName(), got, want[f.GetName()])
		}
		delete(want, f.GetName())
	}
	if len(want) != 0 {
		t.Fatalf("not gathered: %v", want)
	}
}
