package metricstest

import (
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestValueAndByLabel(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"a", "b"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "h"})
	reg.MustRegister(c, g)
	c.WithLabelValues("x", "1").Add(2)
	c.WithLabelValues("y", "1").Add(5)
	g.Set(7)
	if v, ok := Value(t, reg, "c_total", map[string]string{"a": "y", "b": "1"}); !ok || v != 5 {
		t.Errorf("c_total{a=y,b=1} = %v, %v; want 5", v, ok)
	}
	if _, ok := Value(t, reg, "c_total", map[string]string{"a": "z"}); ok {
		t.Error("a series that does not exist was found")
	}
	if v, ok := Value(t, reg, "g", nil); !ok || v != 7 {
		t.Errorf("g = %v, %v; want 7", v, ok)
	}
	if got := ByLabel(t, reg, "c_total", "a"); len(got) != 2 || got["x"] != 2 || got["y"] != 5 {
		t.Errorf("ByLabel = %v", got)
	}
}

func TestAll(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"b", "a"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h", Help: "h"}, []string{"a"})
	reg.MustRegister(c, h)
	c.WithLabelValues("2", "1").Add(3)
	c.WithLabelValues("x", "1").Inc()
	h.WithLabelValues("1").Observe(5)
	h.WithLabelValues("1").Observe(6)
	if got, want := All(t, reg, "c_total"), map[string]float64{`{a="1",b="2"}`: 3, `{a="1",b="x"}`: 1}; !maps.Equal(got, want) {
		t.Errorf("counter: %v, want %v", got, want)
	}
	if got, want := All(t, reg, "h"), map[string]float64{`{a="1"}`: 2}; !maps.Equal(got, want) {
		t.Errorf("histogram: %v, want %v", got, want)
	}
}
