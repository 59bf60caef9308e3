package nodeproxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/telemetry"
)

// metrics are the node proxy's connection metrics, with Istio's names.
type metrics struct {
	opened   *prometheus.CounterVec
	closed   *prometheus.CounterVec
	sent     *prometheus.CounterVec
	received *prometheus.CounterVec
	std      *telemetry.TCP // Istio's standard metrics (istio_tcp_*)
	// baggage counts inbound tunnels whose CONNECT baggage did not name
	// the caller, by reason (telemetry.Caller).
	baggage *prometheus.CounterVec
}

// connection labels: direction (inbound/outbound), the peers' identities
// ("unauthenticated" when unknown), the destination service, and for closes
// the reason ("ok" or what refused or broke it).
var connLabels = []string{"direction", "source_principal", "destination_principal", "destination_service"}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		opened: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tcp_connections_opened_total",
			Help: "Connections opened by the node proxy."}, connLabels),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tcp_connections_closed_total",
			Help: "Connections closed by the node proxy, by reason."}, append(connLabels, "reason")),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tcp_sent_bytes_total",
			Help: "Bytes sent toward the destination."}, connLabels),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tcp_received_bytes_total",
			Help: "Bytes received from the destination."}, connLabels),
	}
	m.std, m.baggage = telemetry.NewTCP(), telemetry.NewBaggageIgnored()
	reg.MustRegister(m.opened, m.closed, m.sent, m.received, m.std.Opened, m.std.Closed, m.std.Bytes, m.baggage)
	return m
}
