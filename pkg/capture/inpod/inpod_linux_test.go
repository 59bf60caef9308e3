package inpod_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"

	"github.com/causeway-mesh/causeway/pkg/capture/handoff"
	"github.com/causeway-mesh/causeway/pkg/capture/inpod"
	"github.com/causeway-mesh/causeway/pkg/capture/internal/netnstest"
	"github.com/causeway-mesh/causeway/pkg/capture/rules"
	"github.com/causeway-mesh/causeway/pkg/nodeproxy"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

const node = "node-1"

// gatedCerts issues real certificates from a test CA, but only once its
// gate is open: a CA that has not answered yet.
type gatedCerts struct {
	t    testing.TB
	ca   *trusttest.CA
	gate chan struct{}
	mu   sync.Mutex
	have map[trust.Identity]*tls.Certificate
}

func (g *gatedCerts) Get(ctx context.Context, id trust.Identity) (*tls.Certificate, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, fmt.Errorf("certificate for %s: %w", id, ctx.Err())
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.have[id] == nil {
		g.have[id] = g.ca.Certificate(g.t, id, time.Hour)
	}
	return g.have[id], nil
}
func (g *gatedCerts) Prefetch(trust.Identity)                   {}
func (g *gatedCerts) Forget(trust.Identity)                     {}
func (g *gatedCerts) Snapshot() []certmanager.CertificateStatus { return nil }

// world is a node with three pods on a bridge: client and server are in
// the mesh and captured, outsider is neither.
type world struct {
	net                      *netnstest.Net
	client, server, outsider *netnstest.Pod
	ca                       *trusttest.CA
	certs                    *gatedCerts
	registry                 *nodeproxy.Registry
	clientInfo, serverInfo   handoff.Pod
}

func newWorld(t testing.TB) *world {
	netnstest.Require(t)
	w := &world{net: netnstest.NewNet(t)}
	w.client = w.net.AddPod(t, "client")
	w.server = w.net.AddPod(t, "server")
	w.outsider = w.net.AddPod(t, "outsider")
	w.ca = trusttest.NewCA(t, "cluster.local")
	w.certs = &gatedCerts{t: t, ca: w.ca, gate: make(chan struct{}), have: map[trust.Identity]*tls.Certificate{}}
	close(w.certs.gate)
	wl := func(uid string, p *netnstest.Pod, mesh bool) *meshv1.Workload {
		addrs := []string{p.IP4.String()}
		if p.IP6.IsValid() {
			addrs = append(addrs, p.IP6.String())
		}
		return &meshv1.Workload{Uid: uid, Name: uid, Namespace: "t", ServiceAccount: uid, Identity: "spiffe://cluster.local/ns/t/sa/" + uid,
			Node: node, Addresses: addrs, Hbone: mesh}
	}
	w.registry = nodeproxy.NewRegistry(node, []*meshv1.Workload{wl("client", w.client, true), wl("server", w.server, true), wl("outsider", w.outsider, false)}, nil, nil)
	w.clientInfo = handoff.Pod{UID: "client", Name: "client", Namespace: "t", ServiceAccount: "client"}
	w.serverInfo = handoff.Pod{UID: "server", Name: "server", Namespace: "t", ServiceAccount: "server"}
	probes := []netip.Addr{w.net.Gateway4}
	if w.net.IPv6 {
		probes = append(probes, w.net.Gateway6)
	}
	for _, p := range []*netnstest.Pod{w.client, w.server} {
		if err := (rules.NFTables{}).Apply(p.Fd(), rules.Config{ProbeSources: probes}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*netnstest.Pod{w.server, w.outsider} {
		serveApp(t, p)
	}
	return w
}

// serveApp runs an HTTP server on port 8080 inside the pod that says who
// it saw connecting.
func serveApp(t testing.TB, p *netnstest.Pod) {
	var ln net.Listener
	err := inNetns(p, func() (err error) {
		ln, err = net.Listen("tcp", ":8080")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "%s saw %s", p.Name[len(p.Name)-6:], host)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

func inNetns(p *netnstest.Pod, f func() error) error {
	return ns.WithNetNSPath(p.Path(), func(ns.NetNS) error { return f() })
}

// proxyUnderTest is a node proxy in in-pod mode with its Manager.
type proxyUnderTest struct {
	proxy  *nodeproxy.Proxy
	mgr    *inpod.Manager
	logs   *observer.ObservedLogs
	cancel context.CancelFunc
	done   chan struct{}
}

func startProxy(t testing.TB, w *world, certWait time.Duration) *proxyUnderTest {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	var mgr *inpod.Manager
	p, err := nodeproxy.New(nodeproxy.Options{Node: node, Bundle: w.ca.Bundle, Certificates: w.certs, Logger: zap.New(core),
		InPod: true, AllowPlaintext: true, CertWait: certWait, ConnectTimeout: 2 * time.Second,
		Dial: func(ctx context.Context, local netip.Addr, remote netip.AddrPort) (net.Conn, error) {
			return mgr.Dial(ctx, local, remote)
		}})
	if err != nil {
		t.Fatal(err)
	}
	mgr = inpod.NewManager(p, inpod.Options{Logger: zap.New(core).Named("inpod")})
	p.Update(w.registry)
	ctx, cancel := context.WithCancel(context.Background())
	pt := &proxyUnderTest{proxy: p, mgr: mgr, logs: logs, cancel: cancel, done: make(chan struct{})}
	go func() { p.Run(ctx, time.Second); close(pt.done) }()
	t.Cleanup(pt.stop)
	return pt
}

func (pt *proxyUnderTest) stop() {
	pt.mgr.Close()
	pt.cancel()
	<-pt.done
}

func (pt *proxyUnderTest) add(t testing.TB, info handoff.Pod, p *netnstest.Pod) {
	t.Helper()
	f, err := openNetns(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := pt.mgr.AddPod(context.Background(), info, f); err != nil {
		t.Fatal(err)
	}
}

// connections lists the proxy's access log lines as
// "direction src_identity dst hop result src".
func (pt *proxyUnderTest) connections() []string {
	var out []string
	for _, e := range pt.logs.FilterMessage("connection").All() {
		m := e.ContextMap()
		out = append(out, fmt.Sprintf("%s %s %s %s %s %s", m["direction"], m["src_identity"], m["dst"], m["hop"], m["result"], m["src"]))
	}
	return out
}

// get fetches url with a plain Go client whose sockets are made inside
// the pod, as any program in the pod would, marked when mark != 0.
func get(p *netnstest.Pod, url string, mark int) (string, error) {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetns(p, func() (err error) {
			d := net.Dialer{Timeout: 5 * time.Second}
			if mark != 0 {
				d.Control = func(_, _ string, rc syscall.RawConn) error {
					return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark) })
				}
			}
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// clientReachesServer: an unmodified client in the client pod gets an
// answer from the server's app, delivered by a node proxy.
func (w *world) clientReachesServer(t *testing.T) {
	t.Helper()
	got, err := get(w.client, url(w.server.IP4), 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := "server saw " + w.server.IP4.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func url(a netip.Addr) string { return "http://" + netip.AddrPortFrom(a, 8080).String() + "/" }

// hasEntry waits for an access log line starting with prefix: a
// connection is logged when it ends, a moment after the client is done.
func (pt *proxyUnderTest) hasEntry(prefix string) bool {
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, e := range pt.connections() {
			if strings.HasPrefix(e, prefix) {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// count is the number of access log lines containing s, once lines of
// connections already ended have had a moment to be written.
func (pt *proxyUnderTest) count(s string) int {
	time.Sleep(200 * time.Millisecond)
	n := 0
	for _, e := range pt.connections() {
		if strings.Contains(e, s) {
			n++
		}
	}
	return n
}

// TestInPodCapture: traffic of unmodified clients is captured on the way
// out and in, carried over HBONE between the pods' namespaces, and leaves
// alone what the rules exempt.
func TestInPodCapture(t *testing.T) {
	w := newWorld(t)
	pt := startProxy(t, w, 5*time.Second)
	pt.add(t, w.clientInfo, w.client)
	pt.add(t, w.serverInfo, w.server)
	srv4 := netip.AddrPortFrom(w.server.IP4, 8080)

	t.Run("outbound and inbound over HBONE, curl", func(t *testing.T) {
		out, err := w.client.Cmd("curl", "-sS", "--max-time", "10", url(w.server.IP4)).CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v %s", err, out)
		}
		// The app sees its own pod's address: the proxy delivers from inside the pod.
		if want := "server saw " + w.server.IP4.String(); string(out) != want {
			t.Errorf("curl got %q, want %q", out, want)
		}
		if !pt.hasEntry("outbound spiffe://cluster.local/ns/t/sa/client " + srv4.String() + " hbone " + netip.AddrPortFrom(w.server.IP4, 15008).String()) {
			t.Errorf("no outbound HBONE record with the original destination: %q", pt.connections())
		}
		if !pt.hasEntry("inbound spiffe://cluster.local/ns/t/sa/client " + srv4.String()) {
			t.Errorf("no inbound record with the client's identity: %q", pt.connections())
		}
	})

	t.Run("source IP is the pod's", func(t *testing.T) {
		// Outbound to a pod outside the mesh goes as plain TCP, dialled
		// inside the client pod: the outsider sees the client's IP.
		got, err := get(w.client, url(w.outsider.IP4), 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := "tsider saw " + w.client.IP4.String(); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
		if !pt.hasEntry("outbound spiffe://cluster.local/ns/t/sa/client " + netip.AddrPortFrom(w.outsider.IP4, 8080).String() + " tcp") {
			t.Errorf("not captured: %q", pt.connections())
		}
	})

	t.Run("inbound plaintext from outside the mesh", func(t *testing.T) {
		got, err := get(w.outsider, url(w.server.IP4), 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := "server saw " + w.server.IP4.String(); got != want {
			t.Errorf("got %q, want %q (delivered by the proxy)", got, want)
		}
		if !pt.hasEntry("inbound unauthenticated " + srv4.String()) {
			t.Errorf("no unauthenticated inbound record: %q", pt.connections())
		}
	})

	t.Run("probes from the node are not captured", func(t *testing.T) {
		from := " " + w.net.Gateway4.String() + ":"
		out, err := w.net.Node.Cmd("curl", "-sS", "--max-time", "10", url(w.server.IP4)).CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v %s", err, out)
		}
		if want := "server saw " + w.net.Gateway4.String(); string(out) != want {
			t.Errorf("probe got %q, want %q (straight to the app)", out, want)
		}
		if n := pt.count(from); n != 0 {
			t.Errorf("the probe went through the proxy: %q", pt.connections())
		}
	})

	t.Run("marked sockets are not captured", func(t *testing.T) {
		to := " " + netip.AddrPortFrom(w.outsider.IP4, 8080).String() + " "
		before := pt.count(to)
		got, err := get(w.client, url(w.outsider.IP4), 0x539)
		if err != nil {
			t.Fatal(err)
		}
		if want := "tsider saw " + w.client.IP4.String(); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
		if n := pt.count(to); n != before {
			t.Errorf("a marked connection went through the proxy: %q", pt.connections())
		}
	})

	t.Run("IPv6", func(t *testing.T) {
		if !w.net.IPv6 {
			t.Skip("the kernel has no IPv6")
		}
		out, err := w.client.Cmd("curl", "-sS", "--max-time", "10", url(w.server.IP6)).CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v %s", err, out)
		}
		if want := "server saw " + w.server.IP6.String(); string(out) != want {
			t.Errorf("curl got %q, want %q", out, want)
		}
		dst := netip.AddrPortFrom(w.server.IP6, 8080).String()
		if !pt.hasEntry("outbound spiffe://cluster.local/ns/t/sa/client " + dst + " hbone") {
			t.Errorf("no IPv6 outbound HBONE record: %q", pt.connections())
		}
		// Inbound plaintext over IPv6 (15006, IP6T_SO_ORIGINAL_DST).
		got, err := get(w.outsider, url(w.server.IP6), 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := "server saw " + w.server.IP6.String(); got != want {
			t.Errorf("got %q, want %q (delivered by the proxy)", got, want)
		}
		if !pt.hasEntry("inbound unauthenticated " + dst) {
			t.Errorf("no unauthenticated IPv6 inbound record: %q", pt.connections())
		}
	})
}

// TestInPodWaitsForCertificate: a connection made before the pod's
// certificate exists waits for it, within CertWait.
func TestInPodWaitsForCertificate(t *testing.T) {
	w := newWorld(t)
	w.certs.gate = make(chan struct{})
	pt := startProxy(t, w, 5*time.Second)
	pt.add(t, w.clientInfo, w.client)
	pt.add(t, w.serverInfo, w.server)
	time.AfterFunc(300*time.Millisecond, func() { close(w.certs.gate) })
	w.clientReachesServer(t)
}

// TestInPodRemoval: removing a pod closes its connections, and its
// traffic then fails closed (nothing listens where the rules send it).
func TestInPodRemoval(t *testing.T) {
	w := newWorld(t)
	pt := startProxy(t, w, 5*time.Second)
	pt.add(t, w.clientInfo, w.client)
	pt.add(t, w.serverInfo, w.server)
	var c net.Conn
	err := inNetns(w.client, func() (err error) {
		c, err = net.DialTimeout("tcp", netip.AddrPortFrom(w.server.IP4, 8080).String(), 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err != nil {
		t.Fatalf("first response: %v", err)
	}
	pt.mgr.RemovePod("client")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, err := c.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the connection outlived its pod's removal")
			}
			break
		}
	}
	if got, err := get(w.client, url(w.server.IP4), 0); err == nil {
		t.Errorf("after removal the client still got %q", got)
	}
}

// TestInPodRestart: a new node proxy gets the pods replayed by the agent
// and listens beside the old one (SO_REUSEPORT); once the old one stops,
// capture goes on. It reports how many connections failed meanwhile.
func TestInPodRestart(t *testing.T) {
	w := newWorld(t)
	agent := &handoff.Server{AckTimeout: 5 * time.Second}
	sock := filepath.Join(t.TempDir(), "handoff.sock")
	ln, err := handoff.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	defer acancel()
	go agent.Serve(actx, ln)

	connect := func(pt *proxyUnderTest) (snap chan struct{}, stop func()) {
		snap = make(chan struct{}, 4)
		ctx, cancel := context.WithCancel(context.Background())
		c := &handoff.Client{Path: sock, State: handoff.NewState(pt.mgr), OnSnapshot: func() { snap <- struct{}{} }}
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		return snap, func() { cancel(); <-done }
	}
	old := startProxy(t, w, 5*time.Second)
	snap, stopOld := connect(old)
	<-snap
	for _, p := range []struct {
		info handoff.Pod
		pod  *netnstest.Pod
	}{{w.clientInfo, w.client}, {w.serverInfo, w.server}} {
		f, err := openNetns(p.pod)
		if err != nil {
			t.Fatal(err)
		}
		if err := agent.AddPod(p.info, f); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := get(w.client, url(w.server.IP4), 0); err != nil {
		t.Fatalf("through the old proxy: %v", err)
	}
	// A connection the old proxy carries, asked again during its drain.
	var held net.Conn
	if err := inNetns(w.client, func() (err error) {
		held, err = net.DialTimeout("tcp", netip.AddrPortFrom(w.server.IP4, 8080).String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldReader := bufio.NewReader(held)
	ask := func() error {
		held.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(held, "GET / HTTP/1.1\r\nHost: server\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(heldReader, nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := ask(); err != nil {
		t.Fatalf("a held connection through the old proxy: %v", err)
	}

	// An HBONE connection (a waypoint's, say) the old proxy accepted.
	goAway := hboneConnGoAway(t, w, w.outsider, netip.AddrPortFrom(w.server.IP4, 15008))

	// Keep connecting during the restart.
	var (
		mu          sync.Mutex
		ok, failed  int
		failedSince time.Time     // start of the failing attempts in a row
		window      time.Duration // the longest such run, to the next success
		stopLoad    = make(chan struct{})
		loadDone    = make(chan struct{})
	)
	go func() {
		defer close(loadDone)
		for {
			select {
			case <-stopLoad:
				return
			default:
			}
			begin := time.Now()
			_, err := get(w.client, url(w.server.IP4), 0)
			mu.Lock()
			if err != nil {
				failed++
				if failedSince.IsZero() {
					failedSince = begin
				}
			} else {
				ok++
				if !failedSince.IsZero() {
					window = max(window, time.Since(failedSince))
					failedSince = time.Time{}
				}
			}
			mu.Unlock()
		}
	}()
	time.Sleep(100 * time.Millisecond)
	next := startProxy(t, w, 5*time.Second)
	snapNew, stopNew := connect(next)
	defer stopNew()
	select {
	case <-snapNew:
	case <-time.After(10 * time.Second):
		t.Fatal("the new proxy got no replay")
	}
	if n := len(next.mgr.Pods()); n != 2 {
		t.Fatalf("the new proxy serves %d pods, want 2", n)
	}
	stopOld()
	dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Second)
	drained := make(chan struct{})
	go func() { old.mgr.Shutdown(dctx); close(drained) }()
	// The drain carries what the old proxy relays: the held connection
	// still answers in it (its relay holds no goroutine the drain could
	// wait for; the proxy's count of relays does).
	time.Sleep(500 * time.Millisecond)
	if err := ask(); err != nil {
		t.Errorf("the held connection during the old proxy's drain: %v", err)
	}
	// Its peer was told at once to open new tunnels elsewhere (it would
	// otherwise go on opening them there until the drain's end cut them).
	select {
	case err := <-goAway:
		if err != nil {
			t.Errorf("the HBONE connection the old proxy accepted, in its drain: %v", err)
		}
	default:
		t.Error("the HBONE connection the old proxy accepted had no GOAWAY 500ms into its drain")
	}
	<-drained
	dcancel()
	old.stop()
	time.Sleep(200 * time.Millisecond)
	close(stopLoad)
	<-loadDone
	mu.Lock()
	t.Logf("during the restart: %d connections succeeded, %d failed; new connections failed for at most %s in a row", ok, failed, window)
	mu.Unlock()
	w.clientReachesServer(t)
	if !next.hasEntry("outbound spiffe://cluster.local/ns/t/sa/client") {
		t.Errorf("the new proxy carried nothing: %q", next.connections())
	}
}

// hboneConnGoAway opens an HBONE connection (TLS with a mesh certificate,
// the HTTP/2 preface) from inside pod to addr, and reports on the channel
// when it gets a GOAWAY (nil) or ends without one.
func hboneConnGoAway(t *testing.T, w *world, from *netnstest.Pod, addr netip.AddrPort) <-chan error {
	t.Helper()
	cert := w.ca.Certificate(t, trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/outsider"), time.Hour)
	server := trusttest.Identity(t, "spiffe://cluster.local/ns/t/sa/server")
	var conn *tls.Conn
	if err := inNetns(from, func() (err error) {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second},
			Config: trust.ClientConfig(w.ca.Bundle, func() (*tls.Certificate, error) { return cert, nil }, []trust.Identity{server})}
		c, err := d.Dial("tcp", addr.String())
		if err == nil {
			conn = c.(*tls.Conn)
		}
		return err
	}); err != nil {
		t.Fatalf("HBONE connection to %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	fr := http2.NewFramer(conn, conn)
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				got <- fmt.Errorf("ended without a GOAWAY: %w", err)
				return
			}
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				got <- nil
				return
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					_ = fr.WritePing(true, f.Data)
				}
			}
		}
	}()
	return got
}

// TestInPodWaitsForWorkload: a pod can be handed over before the control
// plane has described it; its first connection waits for the workload.
func TestInPodWaitsForWorkload(t *testing.T) {
	w := newWorld(t)
	full := w.registry
	w.registry = nodeproxy.NewRegistry(node, nil, nil, nil)
	pt := startProxy(t, w, 5*time.Second)
	pt.add(t, w.clientInfo, w.client)
	pt.add(t, w.serverInfo, w.server)
	time.AfterFunc(300*time.Millisecond, func() { pt.proxy.Update(full) })
	w.clientReachesServer(t)
}

// TestInPodSourceIsThePod: the source workload is the pod whose namespace
// the connection came from; an address that belongs to another workload
// gains nothing.
func TestInPodSourceIsThePod(t *testing.T) {
	w := newWorld(t)
	pt := startProxy(t, w, 500*time.Millisecond)
	pt.add(t, handoff.Pod{UID: "impostor", Name: "impostor", Namespace: "t", ServiceAccount: "impostor"}, w.client)
	pt.add(t, w.serverInfo, w.server)
	if got, err := get(w.client, url(w.server.IP4), 0); err == nil {
		t.Fatalf("a pod whose uid is not the workload's got %q", got)
	}
	if !pt.hasEntry("outbound unauthenticated " + netip.AddrPortFrom(w.server.IP4, 8080).String()) {
		t.Errorf("no refused outbound record: %q", pt.connections())
	}
}

// serveSink runs a TCP server on port 9000 inside the pod that reads
// everything, then answers with the byte count.
func serveSink(b testing.TB, p *netnstest.Pod) {
	var ln net.Listener
	if err := inNetns(p, func() (err error) {
		ln, err = net.Listen("tcp", ":9000")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				fmt.Fprintf(c, "%d", n)
			}()
		}
	}()
}

// benchmarkStream sends b.N chunks of 64 KiB from a namespace to the
// server pod's sink on one connection.
func benchmarkStream(b *testing.B, from *netnstest.NS, to netip.Addr) {
	var c net.Conn
	if err := ns.WithNetNSPath(from.Path(), func(ns.NetNS) (err error) {
		c, err = net.DialTimeout("tcp", netip.AddrPortFrom(to, 9000).String(), 5*time.Second)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	chunk := make([]byte, 64<<10)
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	reply, err := io.ReadAll(c)
	b.StopTimer()
	if err != nil || string(reply) != fmt.Sprint(b.N*len(chunk)) {
		b.Fatalf("the sink got %q bytes (%v), want %d", reply, err, b.N*len(chunk))
	}
}

// BenchmarkInPodStream: one TCP stream between two captured pods, through
// the node proxy (out of the client pod, HBONE, into the server pod).
// BenchmarkDirectStream is the same stream from the node, which the rules
// let through to the app: the ratio of the two is the cost of capture.
func BenchmarkInPodStream(b *testing.B) {
	w := newWorld(b)
	serveSink(b, w.server)
	pt := startProxy(b, w, 5*time.Second)
	pt.add(b, w.clientInfo, w.client)
	pt.add(b, w.serverInfo, w.server)
	benchmarkStream(b, w.client.NS, w.server.IP4)
}

func BenchmarkDirectStream(b *testing.B) {
	w := newWorld(b)
	serveSink(b, w.server)
	benchmarkStream(b, w.net.Node, w.server.IP4)
}
