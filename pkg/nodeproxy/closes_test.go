package nodeproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/internal/metricstest"
)

// A waypoint that answers in full and ends the tunnel while the client has
// not ended its side (END_STREAM, then RST_STREAM NO_ERROR: "stop
// sending", RFC 9113 §8.1) completed the exchange: the client's node
// proxy logs and counts the connection as ok. One that resets the tunnel
// mid-answer (CANCEL) failed it: logged with the reset, counted as error.
func TestWaypointEndingTheTunnelIsOkAndResettingItIsNot(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := startMeshWith(t, func(o *Options) {
		if o.Node == "node-a" {
			o.Registry = reg
		}
	}, "node-a", "node-b")
	reset := make(chan bool, 1)
	startWaypoint(t, m, hbone.HandlerFunc(func(ctx context.Context, r *hbone.Request) (hbone.Stream, error) {
		if !<-reset {
			return hbone.StreamFunc(func(_ context.Context, tunnel net.Conn) {
				tunnel.Write([]byte("answer")) // and return: the server ends the stream
			}), nil
		}
		a, b := net.Pipe()
		rs := hbone.RelayTo(a, 0, func(int64, int64, error) {})
		go func() {
			b.Write([]byte("part"))
			time.Sleep(100 * time.Millisecond)
			rs.Abort(errors.New("upstream failed"))
		}()
		return rs, nil
	}))

	closed := func(reason string) float64 {
		v, _ := metricstest.Value(t, reg, "tcp_connections_closed_total", map[string]string{"direction": "outbound", "reason": reason})
		return v
	}
	for i, c := range []struct {
		reset      bool
		reply      string
		result     string // in the access log line
		metricWant string
	}{
		{reset: false, reply: "answer", result: "ok", metricWant: "ok"},
		{reset: true, reply: "part", result: "stream reset by peer: CANCEL", metricWant: "error"},
	} {
		before := closed(c.metricWant)
		reset <- c.reset
		conn, err := m.dial(t, "node-a", podA, podD+":8080")
		if err != nil {
			t.Fatal(err)
		}
		// The client does not end its side: it reads the answer, then closes.
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		out, _ := io.ReadAll(conn)
		conn.Close()
		if string(out) != c.reply {
			t.Fatalf("case %d: reply %q, want %q", i, out, c.reply)
		}
		waitFor(t, fmt.Sprintf("case %d: the access line and the metric", i), func() error {
			lines := accessLines(m.logs["node-a"], "outbound")
			if len(lines) <= i {
				return fmt.Errorf("%d access lines", len(lines))
			}
			if got := fmt.Sprint(lines[i]["result"]); !strings.Contains(got, c.result) {
				return fmt.Errorf("result %q, want %q", got, c.result)
			}
			if got := closed(c.metricWant); got != before+1 {
				return fmt.Errorf("tcp_connections_closed_total{reason=%s} %v, want %v", c.metricWant, got, before+1)
			}
			return nil
		})
	}
}
