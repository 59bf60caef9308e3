package hbone

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// rawH2 is a hand-driven HTTP/2 client for protocol edge cases.
type rawH2 struct {
	t    *testing.T
	conn *tls.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
}

func dialRaw(t *testing.T, m *mesh, addr netip.AddrPort, preface bool) *rawH2 {
	t.Helper()
	cfg := trust.ClientConfig(m.ca.Bundle, func() (*tls.Certificate, error) { return m.clientCert, nil },
		[]trust.Identity{m.serverID})
	conn, err := tls.Dial("tcp", addr.String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	r := &rawH2{t: t, conn: conn, fr: http2.NewFramer(conn, conn)}
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.enc = hpack.NewEncoder(&r.hbuf)
	if preface {
		conn.Write([]byte(http2.ClientPreface))
		r.fr.WriteSettings()
		f := r.next()
		if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
			t.Fatalf("first frame from server: %v", f)
		}
		r.fr.WriteSettingsAck()
	}
	return r
}

// next reads one frame, acknowledging SETTINGS on the way.
func (r *rawH2) next() http2.Frame {
	r.t.Helper()
	f, err := r.fr.ReadFrame()
	if err != nil {
		r.t.Fatalf("reading frame: %v", err)
	}
	return f
}

// until reads frames until match returns true, skipping the rest.
func (r *rawH2) until(what string, match func(http2.Frame) bool) http2.Frame {
	r.t.Helper()
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.t.Fatalf("waiting for %s: %v", what, err)
		}
		if match(f) {
			return f
		}
	}
}

func (r *rawH2) headers(id uint32, end bool, kv ...string) {
	r.t.Helper()
	r.hbuf.Reset()
	for i := 0; i < len(kv); i += 2 {
		r.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: id, BlockFragment: r.hbuf.Bytes(), EndStream: end, EndHeaders: true,
	}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawH2) connect(id uint32, authority string) {
	r.headers(id, false, ":method", "CONNECT", ":authority", authority)
}

func (r *rawH2) status(id uint32) string {
	r.t.Helper()
	f := r.until("response headers", func(f http2.Frame) bool {
		mh, ok := f.(*http2.MetaHeadersFrame)
		return ok && mh.StreamID == id
	})
	return f.(*http2.MetaHeadersFrame).PseudoValue("status")
}

func (r *rawH2) expectStatus(id uint32, want string) {
	r.t.Helper()
	if s := r.status(id); s != want {
		r.t.Fatalf("stream %d: status %s, want %s", id, s, want)
	}
}

func (r *rawH2) expectGoAway(code http2.ErrCode) {
	r.t.Helper()
	f := r.until("GOAWAY", func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok })
	ga := f.(*http2.GoAwayFrame)
	if ga.ErrCode != code {
		r.t.Fatalf("GOAWAY %v (%q), want %v", ga.ErrCode, ga.DebugData(), code)
	}
	if code != http2.ErrCodeNo && len(ga.DebugData()) == 0 {
		r.t.Errorf("GOAWAY %v without a reason", code)
	}
}

func (r *rawH2) expectRST(id uint32, code http2.ErrCode) {
	r.t.Helper()
	f := r.until("RST_STREAM", func(f http2.Frame) bool {
		rst, ok := f.(*http2.RSTStreamFrame)
		return ok && rst.StreamID == id
	})
	if got := f.(*http2.RSTStreamFrame).ErrCode; got != code {
		r.t.Fatalf("RST_STREAM %v, want %v", got, code)
	}
}

// holdHandler answers 200 and holds the tunnel, reading nothing, until the
// stream ends.
var holdHandler = HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
	return StreamFunc(func(ctx context.Context, tunnel net.Conn) { <-ctx.Done() }), nil
})

func TestProtocolPing(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, nil)
	r := dialRaw(t, m, addr, true)
	data := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	r.fr.WritePing(false, data)
	f := r.until("PING ack", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
	if f.(*http2.PingFrame).Data != data {
		t.Fatal("PING ack with other data")
	}
}

func TestProtocolConnectionErrors(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, nil)
	cases := map[string]func(r *rawH2){
		"DATA on idle stream": func(r *rawH2) { r.fr.WriteData(5, false, []byte("x")) },
		"even stream":         func(r *rawH2) { r.connect(2, "10.0.0.1:80") },
		"DATA on stream 0":    func(r *rawH2) { r.fr.WriteRawFrame(http2.FrameData, 0, 0, []byte("x")) },
		"PUSH_PROMISE": func(r *rawH2) {
			r.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, EndHeaders: true})
		},
		"window overflow":       func(r *rawH2) { r.fr.WriteWindowUpdate(0, 1<<31-1) },
		"RST on idle stream":    func(r *rawH2) { r.fr.WriteRSTStream(7, http2.ErrCodeCancel) },
		"bad max frame setting": func(r *rawH2) { r.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 100}) },
	}
	for name, send := range cases {
		t.Run(name, func(t *testing.T) {
			r := dialRaw(t, m, addr, true)
			send(r)
			want := http2.ErrCodeProtocol
			if name == "window overflow" {
				want = http2.ErrCodeFlowControl
			}
			r.expectGoAway(want)
		})
	}
	t.Run("no SETTINGS first", func(t *testing.T) {
		r := dialRaw(t, m, addr, false)
		r.conn.Write([]byte(http2.ClientPreface))
		r.fr.WritePing(false, [8]byte{})
		r.expectGoAway(http2.ErrCodeProtocol)
	})
	t.Run("bad preface", func(t *testing.T) {
		r := dialRaw(t, m, addr, false)
		r.conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		if _, err := io.ReadAll(r.conn); err != nil && !errors.Is(err, io.EOF) && !isConnReset(err) {
			t.Fatalf("connection not closed: %v", err)
		}
	})
}

func isConnReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "reset") || strings.Contains(err.Error(), "broken pipe"))
}

// Streams beyond MAX_CONCURRENT_STREAMS are refused, not queued.
func TestProtocolRefusedStream(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, func(o *ServerOptions) { o.MaxConcurrentStreams = 2 })
	r := dialRaw(t, m, addr, true)
	r.connect(1, "10.0.0.1:80")
	if s := r.status(1); s != "200" {
		t.Fatalf("stream 1: %s", s)
	}
	r.connect(3, "10.0.0.1:80")
	if s := r.status(3); s != "200" {
		t.Fatalf("stream 3: %s", s)
	}
	r.connect(5, "10.0.0.1:80")
	r.expectRST(5, http2.ErrCodeRefusedStream)
	// A freed slot takes the next stream.
	r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	deadline := time.Now().Add(30 * time.Second)
	for id := uint32(7); ; id += 2 {
		r.connect(id, "10.0.0.1:80")
		f := r.until("answer", func(f http2.Frame) bool {
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				return f.StreamID == id
			case *http2.RSTStreamFrame:
				return f.StreamID == id
			}
			return false
		})
		if mh, ok := f.(*http2.MetaHeadersFrame); ok && mh.PseudoValue("status") == "200" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("slot never freed after the reset")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestProtocolHeaderTooLarge(t *testing.T) {
	m := newMesh(t)
	h := &dialHandler{}
	_, addr := startServer(t, m, h, func(o *ServerOptions) { o.MaxHeaderBytes = 2048 })
	r := dialRaw(t, m, addr, true)
	long := strings.Repeat("b", 1000)
	r.headers(1, false, ":method", "CONNECT", ":authority", "10.0.0.1:80", "a", long, "b", long, "c", long)
	r.expectStatus(1, "431")
	// The connection is still usable.
	r.connect(3, "10.0.0.1:0")
	r.expectStatus(3, "400")
	// So is a single field longer than the whole limit: it is decoded (and
	// dropped), keeping the HPACK context in step.
	r.headers(5, false, ":method", "CONNECT", ":authority", "10.0.0.1:80", "baggage", strings.Repeat("b", 4096))
	r.expectStatus(5, "431")
	r.connect(7, "10.0.0.1:0")
	r.expectStatus(7, "400")
	// A block beyond twice the limit is not read: the connection ends.
	r.headers(9, false, ":method", "CONNECT", ":authority", "10.0.0.1:80", "baggage", strings.Repeat("b", 8192))
	r.expectGoAway(http2.ErrCodeEnhanceYourCalm)
	if h.opened.Load() != 0 {
		t.Fatal("handler called")
	}
}

// A client that sends beyond the stream window gets its stream reset.
func TestProtocolStreamFlowControl(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, func(o *ServerOptions) { o.StreamWindow = initialWindowSize })
	r := dialRaw(t, m, addr, true)
	r.connect(1, "10.0.0.1:80")
	if s := r.status(1); s != "200" {
		t.Fatal(s)
	}
	chunk := make([]byte, 16384)
	for sent := 0; sent < initialWindowSize; {
		n := min(len(chunk), initialWindowSize-sent)
		r.fr.WriteData(1, false, chunk[:n])
		sent += n
	}
	r.fr.WriteData(1, false, []byte{0})
	r.expectRST(1, http2.ErrCodeFlowControl)
}

// Padded DATA delivers only the data, and padding is returned to the windows.
func TestProtocolPaddedData(t *testing.T) {
	m := newMesh(t)
	up := upstream(t, echo)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	r := dialRaw(t, m, addr, true)
	r.connect(1, up.String())
	if s := r.status(1); s != "200" {
		t.Fatal(s)
	}
	r.fr.WriteDataPadded(1, false, []byte("abc"), make([]byte, 200))
	r.fr.WriteDataPadded(1, true, []byte("def"), make([]byte, 1))
	var got []byte
	for !bytes.Equal(got, []byte("abcdef")) {
		f := r.until("echo", func(f http2.Frame) bool { d, ok := f.(*http2.DataFrame); return ok && d.StreamID == 1 })
		got = append(got, f.(*http2.DataFrame).Data()...)
		if len(got) > 6 {
			t.Fatalf("echo %q", got)
		}
	}
}

// A client that stops answering PING is disconnected.
func TestProtocolKeepalive(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, func(o *ServerOptions) {
		o.ReadIdleTimeout = 100 * time.Millisecond
		o.PingTimeout = 200 * time.Millisecond
	})
	r := dialRaw(t, m, addr, true)
	start := time.Now()
	for {
		if _, err := r.fr.ReadFrame(); err != nil {
			break // closed: the PINGs went unanswered
		}
		if time.Since(start) > 20*time.Second {
			t.Fatal("silent client not disconnected")
		}
	}
}

// A connection that sends no request within HeaderTimeout is closed.
func TestProtocolHeaderTimeout(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, func(o *ServerOptions) { o.HeaderTimeout = 200 * time.Millisecond })
	for _, preface := range []bool{false, true} {
		r := dialRaw(t, m, addr, preface)
		start := time.Now()
		for {
			if _, err := r.fr.ReadFrame(); err != nil {
				break
			}
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Fatalf("preface=%v: closed after %v", preface, d)
		}
	}
}

// Data buffered for reset streams is returned to the connection window:
// far more than one window's worth goes through one connection.
func TestResetStreamsReturnWindow(t *testing.T) {
	m := newMesh(t)
	payload := make([]byte, 1<<20)
	h := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
		return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
			tunnel.Write(payload) // never read by the client
			<-ctx.Done()
		}), nil
	})
	srv, addr := startServer(t, m, h, nil)
	p := newPool(t, m, nil)
	for i := 0; i < 40; i++ { // 40 MiB each way, windows of 16 MiB
		c := dialTunnel(t, p, m.target(addr, "10.0.0.1:80"))
		c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(payload); err != nil {
			t.Fatalf("round %d: %v (connection window leaked?)", i, err)
		}
		time.Sleep(time.Millisecond)
		c.Close()
	}
	if n := len(serverConnStreams(srv)); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
}

// A client that floods PING without reading the answers is disconnected
// rather than growing the server's queue of answers.
func TestProtocolPingFlood(t *testing.T) {
	m := newMesh(t)
	// No other limit may end the connection first.
	_, addr := startServer(t, m, holdHandler, func(o *ServerOptions) {
		o.HeaderTimeout = time.Hour
		o.ReadIdleTimeout = -1
	})
	r := dialRaw(t, m, addr, true)
	r.conn.SetDeadline(time.Now().Add(60 * time.Second))
	var batch bytes.Buffer
	fr := http2.NewFramer(&batch, nil)
	for i := 0; i < 1000; i++ {
		fr.WritePing(false, [8]byte{byte(i)})
	}
	for sent := 0; ; sent++ {
		if _, err := r.conn.Write(batch.Bytes()); err != nil {
			if sent < maxQueuedCtrl/1000 {
				t.Fatalf("connection failed after %d PINGs: %v", sent*1000, err)
			}
			return // the server hung up
		}
		if sent > 20000 {
			t.Fatal("server keeps reading an endless PING flood")
		}
	}
}
