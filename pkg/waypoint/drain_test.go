package waypoint

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
)

// TestShutdownDrainsHTTPInTunnels: at Shutdown an idle keep-alive
// HTTP/1.1 tunnel is closed at once, a request in flight is answered whole
// with Connection: close, and Shutdown returns once they are gone, long
// before its deadline.
func TestShutdownDrainsHTTPInTunnels(t *testing.T) {
	f := start(t)
	idle := f.webTunnel(t)
	idleR := bufio.NewReader(idle)
	fmt.Fprint(idle, "GET / HTTP/1.1\r\nHost: web.shop\r\n\r\n")
	resp, err := http.ReadResponse(idleR, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("before the shutdown: %s, close %v", resp.Status, resp.Close)
	}
	busy := f.webTunnel(t)
	busyR := bufio.NewReader(busy)
	fmt.Fprint(busy, "GET /held HTTP/1.1\r\nHost: web.shop\r\n\r\n")
	if got := <-f.stalls; got != "arrived /held" {
		t.Fatalf("backend: %s", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- f.w.Shutdown(ctx) }()
	testnet.ExpectClosed(t, idle, idleR)
	close(f.release)
	resp, err = http.ReadResponse(busyR, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != heldBody || !resp.Close {
		t.Fatalf("in-flight answer: %d of %d bytes (%v), Connection: close %v", len(body), len(heldBody), err, resp.Close)
	}
	testnet.ExpectClosed(t, busy, busyR)
	// Shutdown returns when the connections are gone: no error, which
	// would be its deadline's.
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown still draining 10 s after its connections closed")
	}
}
