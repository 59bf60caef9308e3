// Package metricstest reads what a Prometheus registry holds, for tests
// that assert what the mesh counted.
package metricstest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value (a counter's or a gauge's) of the series of
// metric name whose labels include every one of labels, and whether there
// is such a series.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	for _, m := range series(t, g, name) {
		if matches(m, labels) {
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// ByLabel returns the counter values of metric name's series by the value
// of their label.
func ByLabel(t testing.TB, g prometheus.Gatherer, name, label string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range series(t, g, name) {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func series(t testing.TB, g prometheus.Gatherer, name string) []*dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

func matches(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// All returns every series of metric name, keyed by its labels (Labels),
// with its value: a counter's or a gauge's, or a histogram's count.
func All(t testing.TB, g prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range series(t, g, name) {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		out[Labels(have)] = m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
	}
	return out
}

// Labels writes a label set as PromQL does, sorted by name.
func Labels(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, m[k]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}
