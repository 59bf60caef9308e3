package tracing

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		endpoint, protocol, sampling string
		want                         Settings
		err                          string
	}{
		{"", "", "", Settings{}, ""},
		{"jaeger.tracing:4317", "", "", Settings{"jaeger.tracing:4317", GRPC, 1}, ""},
		{"10.0.0.1:4318", "http", "0.5", Settings{"10.0.0.1:4318", HTTP, 0.5}, ""},
		{"[fd00::1]:4317", "grpc", "100%", Settings{"[fd00::1]:4317", GRPC, 100}, ""},
		{"collector:4317", "", "0", Settings{"collector:4317", GRPC, 0}, ""},
		{"http://collector:4318", "http", "", Settings{}, `tracing endpoint "http://collector:4318": want host:port`},
		{"collector", "", "", Settings{}, "want host:port"},
		{"collector:0", "", "", Settings{}, `port "0"`},
		{"collector:70000", "", "", Settings{}, `port "70000"`},
		{":4317", "", "", Settings{}, "want host:port"},
		{"collector:4317/v1/traces", "", "", Settings{}, `port "4317/v1/traces"`},
		{"collector:4317", "zipkin", "", Settings{}, `tracing protocol "zipkin": want grpc or http`},
		{"collector:4317", "", "150", Settings{}, `tracing sampling "150": want a percentage from 0 to 100`},
		{"collector:4317", "", "-1", Settings{}, "tracing sampling"},
		{"collector:4317", "", "NaN", Settings{}, "tracing sampling"},
		{"collector:4317", "", "1/100", Settings{}, "tracing sampling"},
		// Bad values are refused even while tracing is off.
		{"", "", "lots", Settings{}, "tracing sampling"},
		{"", "udp", "", Settings{}, "tracing protocol"},
	} {
		got, err := Parse(c.endpoint, c.protocol, c.sampling)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("Parse(%q, %q, %q): %v", c.endpoint, c.protocol, c.sampling, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("Parse(%q, %q, %q) = %v, want an error with %q", c.endpoint, c.protocol, c.sampling, err, c.err)
		case got != c.want:
			t.Errorf("Parse(%q, %q, %q) = %+v, want %+v", c.endpoint, c.protocol, c.sampling, got, c.want)
		}
	}
}
