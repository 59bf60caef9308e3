package hbone

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// RFC 9113 conformance of the server, frame by frame (h2spec_test.go runs
// the whole h2spec suite; these pin each class of case down).

// block encodes a header block with the connection's encoder.
func (r *rawH2) block(kv ...string) []byte {
	r.hbuf.Reset()
	for i := 0; i < len(kv); i += 2 {
		r.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return append([]byte(nil), r.hbuf.Bytes()...)
}

// expectQuiet checks that the server answers a PING without saying
// anything about the streams in between.
func (r *rawH2) expectQuiet() {
	r.t.Helper()
	data := [8]byte{'q', 'u', 'i', 'e', 't'}
	r.fr.WritePing(false, data)
	for {
		switch f := r.next().(type) {
		case *http2.PingFrame:
			if f.IsAck() && f.Data == data {
				return
			}
		case *http2.RSTStreamFrame:
			r.t.Fatalf("RST_STREAM %v on stream %d", f.ErrCode, f.StreamID)
		case *http2.GoAwayFrame:
			r.t.Fatalf("GOAWAY %v (%q)", f.ErrCode, f.DebugData())
		}
	}
}

// closeHandler answers 200 and closes the tunnel at once.
var closeHandler = HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
	return StreamFunc(func(ctx context.Context, tunnel net.Conn) {}), nil
})

// waitStreams waits until the server's only connection has n streams.
func waitStreams(t *testing.T, srv *Server, n int) {
	t.Helper()
	eventually(t, 30*time.Second, "streams to be released", func() bool {
		s := serverConnStreams(srv)
		return len(s) == 1 && s[0] == n
	})
}

// RFC 9113 §5.1: frames on a stream the peer ended or reset are answered
// with STREAM_CLOSED; after our own RST_STREAM they are ignored.
func TestConformanceStreamStates(t *testing.T) {
	m := newMesh(t)
	t.Run("half-closed (remote)", func(t *testing.T) {
		_, addr := startServer(t, m, holdHandler, nil)
		r := dialRaw(t, m, addr, true)
		r.headers(1, true, ":method", "CONNECT", ":authority", "10.0.0.1:80")
		r.expectStatus(1, "200")
		r.headers(1, true, "x-trailer", "1")
		r.expectRST(1, http2.ErrCodeStreamClosed)
		r.headers(3, true, ":method", "CONNECT", ":authority", "10.0.0.1:80")
		r.expectStatus(3, "200")
		r.fr.WriteData(3, false, []byte("late"))
		r.expectRST(3, http2.ErrCodeStreamClosed)
	})
	t.Run("reset by the peer", func(t *testing.T) {
		srv, addr := startServer(t, m, holdHandler, nil)
		r := dialRaw(t, m, addr, true)
		for _, id := range []uint32{1, 3} {
			r.connect(id, "10.0.0.1:80")
			r.expectStatus(id, "200")
			r.fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		r.fr.WriteData(1, false, []byte("late"))
		r.expectRST(1, http2.ErrCodeStreamClosed)
		waitStreams(t, srv, 0)
		r.headers(3, true, "x-trailer", "1")
		r.expectGoAway(http2.ErrCodeStreamClosed)
	})
	t.Run("closed", func(t *testing.T) {
		srv, addr := startServer(t, m, closeHandler, nil)
		r := dialRaw(t, m, addr, true)
		for _, id := range []uint32{1, 3} {
			r.headers(id, true, ":method", "CONNECT", ":authority", "10.0.0.1:80")
			r.until("END_STREAM", func(f http2.Frame) bool {
				d, ok := f.(*http2.DataFrame)
				return ok && d.StreamID == id && d.StreamEnded()
			})
		}
		waitStreams(t, srv, 0)
		// (Our RST_STREAM makes stream 1 one whose frames are ignored.)
		r.fr.WriteData(1, true, []byte("late"))
		r.expectRST(1, http2.ErrCodeStreamClosed)
		r.headers(3, true, "x-trailer", "1")
		r.expectGoAway(http2.ErrCodeStreamClosed)
	})
	t.Run("closed while its handler still holds it", func(t *testing.T) {
		ended := HandlerFunc(func(ctx context.Context, r *Request) (Stream, error) {
			return StreamFunc(func(ctx context.Context, tunnel net.Conn) {
				tunnel.(interface{ CloseWrite() error }).CloseWrite()
				<-ctx.Done()
			}), nil
		})
		_, addr := startServer(t, m, ended, nil)
		r := dialRaw(t, m, addr, true)
		r.headers(1, true, ":method", "CONNECT", ":authority", "10.0.0.1:80")
		r.until("END_STREAM", func(f http2.Frame) bool {
			d, ok := f.(*http2.DataFrame)
			return ok && d.StreamID == 1 && d.StreamEnded()
		})
		r.headers(1, true, "x-trailer", "1")
		r.expectGoAway(http2.ErrCodeStreamClosed)
	})
	t.Run("reset by us", func(t *testing.T) {
		srv, addr := startServer(t, m, closeHandler, nil)
		r := dialRaw(t, m, addr, true)
		r.connect(1, "10.0.0.1:80") // the client keeps sending; the server closes
		r.expectRST(1, http2.ErrCodeNo)
		waitStreams(t, srv, 0)
		// What the client sent before it saw the reset is no error.
		r.fr.WriteData(1, false, []byte("in flight"))
		r.fr.WriteWindowUpdate(1, 100)
		r.headers(1, true, "x-trailer", "1")
		r.expectQuiet()
	})
	t.Run("stream ID lower than an opened one", func(t *testing.T) {
		_, addr := startServer(t, m, holdHandler, nil)
		r := dialRaw(t, m, addr, true)
		r.connect(5, "10.0.0.1:80")
		r.expectStatus(5, "200")
		r.connect(3, "10.0.0.1:80")
		r.expectGoAway(http2.ErrCodeProtocol)
	})
}

// RFC 9113 §8.1.1, §8.2, §8.3: malformed requests are reset with
// PROTOCOL_ERROR and never reach the handler.
func TestConformanceMalformedRequests(t *testing.T) {
	m := newMesh(t)
	h := &dialHandler{}
	_, addr := startServer(t, m, h, nil)
	up := upstream(t, echo).String()
	connect := []string{":method", "CONNECT", ":authority", up}
	get := []string{":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1"}
	with := func(base []string, kv ...string) []string { return append(append([]string(nil), base...), kv...) }
	cases := map[string][]string{
		"connection":                 with(connect, "connection", "keep-alive"),
		"keep-alive":                 with(connect, "keep-alive", "300"),
		"proxy-connection":           with(connect, "proxy-connection", "keep-alive"),
		"transfer-encoding":          with(connect, "transfer-encoding", "chunked"),
		"upgrade":                    with(connect, "upgrade", "websocket"),
		"te other than trailers":     with(connect, "te", "gzip"),
		"upper-case name":            with(connect, "X-Upper", "1"),
		"value with leading SP":      with(connect, "baggage", " a=1"),
		"value with CR":              with(connect, "baggage", "a=1\r"),
		"unknown pseudo-header":      with(connect, ":foo", "1"),
		"response pseudo-header":     with(connect, ":status", "200"),
		"repeated :authority":        with(connect, ":authority", up),
		"pseudo after regular":       {":method", "CONNECT", "baggage", "a=1", ":authority", up},
		"missing :method":            {":authority", up},
		"CONNECT without :authority": {":method", "CONNECT"},
		"CONNECT with :path":         with(connect, ":path", "/"),
		"extended CONNECT":           with(connect, ":protocol", "websocket", ":scheme", "https", ":path", "/"),
		"GET without :scheme":        {":method", "GET", ":path", "/"},
		"GET without :path":          {":method", "GET", ":scheme", "https"},
		"GET with empty :path":       {":method", "GET", ":scheme", "https", ":path", ""},
		"bad content-length":         with(get, "content-length", "1x"),
		"two content-lengths":        with(get, "content-length", "1", "content-length", "2"),
	}
	for name, kv := range cases {
		t.Run(name, func(t *testing.T) {
			r := dialRaw(t, m, addr, true)
			r.headers(1, false, kv...)
			r.expectRST(1, http2.ErrCodeProtocol)
			// The connection goes on.
			r.connect(3, "10.0.0.1:0")
			r.expectStatus(3, "400")
		})
	}
	t.Run("te: trailers", func(t *testing.T) {
		r := dialRaw(t, m, addr, true)
		r.headers(1, false, with(connect, "te", "trailers")...)
		r.expectStatus(1, "200")
	})
	if n := h.opened.Load(); n != 1 {
		t.Fatalf("handler called %d times, want once (te: trailers)", n)
	}
}

// Trailers must end the stream and carry no pseudo-header field.
func TestConformanceTrailers(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, nil)
	r := dialRaw(t, m, addr, true)
	// In increasing stream order (RFC 9113 §5.1.1), so not from a map.
	for _, c := range []struct {
		id uint32
		kv []string
	}{{1, []string{":path", "/"}}, {3, []string{"x-trailer", "1"}}} {
		id, kv := c.id, c.kv
		r.connect(id, "10.0.0.1:80")
		r.expectStatus(id, "200")
		r.headers(id, id == 1, kv...) // stream 3: without END_STREAM
		r.expectRST(id, http2.ErrCodeProtocol)
	}
	// Well-formed trailers end the client's direction.
	r.connect(5, "10.0.0.1:80")
	r.expectStatus(5, "200")
	r.headers(5, true, "x-trailer", "1")
	r.expectQuiet()
}

// RFC 9113 §8.1.1: DATA must add up to the request's content-length.
func TestConformanceContentLength(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, nil)
	cases := []struct {
		name, length string
		data         []string // DATA frames; the last ends the stream
	}{
		{"more than declared", "3", []string{"ab", "cd"}},
		{"less than declared", "5", []string{"ab", "cd"}},
		{"declared without DATA", "5", nil},
		{"as declared", "4", []string{"ab", "cd"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, m, addr, true)
			r.headers(1, len(tc.data) == 0, ":method", "POST", ":scheme", "https", ":path", "/",
				":authority", "a:1", "content-length", tc.length)
			for i, d := range tc.data {
				r.fr.WriteData(1, i == len(tc.data)-1, []byte(d))
			}
			if tc.name != "as declared" {
				r.expectRST(1, http2.ErrCodeProtocol)
				return
			}
			r.expectStatus(1, "405")
			r.expectQuiet()
		})
	}
}

// RFC 9113 §5.3.1: a stream cannot depend on itself.
func TestConformanceSelfDependency(t *testing.T) {
	m := newMesh(t)
	h := &dialHandler{}
	_, addr := startServer(t, m, h, nil)
	r := dialRaw(t, m, addr, true)
	r.fr.WritePriority(1, http2.PriorityParam{StreamDep: 1, Weight: 15})
	r.expectRST(1, http2.ErrCodeProtocol)
	r.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: 3, EndHeaders: true, BlockFragment: r.block(":method", "CONNECT", ":authority", "10.0.0.1:80"),
		Priority: http2.PriorityParam{StreamDep: 3, Weight: 15},
	})
	r.expectRST(3, http2.ErrCodeProtocol)
	r.fr.WritePriority(3, http2.PriorityParam{StreamDep: 1, Weight: 15}) // fine on a closed stream
	r.expectQuiet()
	if h.opened.Load() != 0 {
		t.Fatal("handler called")
	}
}

// Requests without a tunnel get their status with a text body, sent as the
// client's flow control allows; the stream stays open (and counts towards
// MAX_CONCURRENT_STREAMS) until it is.
func TestConformanceRefusalBody(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, func(o *ServerOptions) { o.MaxConcurrentStreams = 2 })
	r := dialRaw(t, m, addr, false)
	r.conn.Write([]byte(http2.ClientPreface))
	r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	get := []string{":method", "GET", ":scheme", "https", ":path", "/", ":authority", "a:1"}
	for _, id := range []uint32{1, 3, 5} {
		r.headers(id, true, get...)
	}
	r.expectRST(5, http2.ErrCodeRefusedStream)
	r.fr.WriteWindowUpdate(1, 1)
	var body []byte
	window := 1
	for {
		switch f := r.next().(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				t.Fatalf("stream %d: response without a body", f.StreamID)
			}
			if f.StreamID == 1 && f.PseudoValue("status") != "405" {
				t.Fatalf("status %s", f.PseudoValue("status"))
			}
		case *http2.DataFrame:
			if f.StreamID != 1 || len(f.Data()) > window {
				t.Fatalf("DATA of %d bytes on stream %d beyond the window", len(f.Data()), f.StreamID)
			}
			body = append(body, f.Data()...)
			if len(body) == 1 {
				window = 1000
				r.fr.WriteWindowUpdate(1, 1000)
			}
			if f.StreamEnded() {
				if want := "only CONNECT is served\n"; string(body) != want {
					t.Fatalf("body %q, want %q", body, want)
				}
				return
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		}
	}
}

// A header block is bounded in frames, bytes and time: a flood of
// CONTINUATION frames (empty, as in CVE-2024-27316, or small) ends the
// connection with GOAWAY instead of keeping the server reading.
func TestConformanceContinuationFlood(t *testing.T) {
	m := newMesh(t)
	// No other limit may end the connection first.
	_, addr := startServer(t, m, holdHandler, func(o *ServerOptions) {
		o.HeaderTimeout = time.Hour
		o.ReadIdleTimeout = -1
	})
	for name, frag := range map[string][]byte{"empty": nil, "1 KiB": bytes.Repeat([]byte{0x40}, 1024)} {
		t.Run(name, func(t *testing.T) {
			r := dialRaw(t, m, addr, true)
			r.conn.SetDeadline(time.Now().Add(60 * time.Second))
			r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: r.block(":method", "CONNECT")})
			var batch bytes.Buffer
			bfr := http2.NewFramer(&batch, nil)
			for i := 0; i < 1000; i++ {
				bfr.WriteContinuation(1, false, frag)
			}
			const total = 3_000_000 // frames
			var sent atomic.Int64
			wrote := make(chan error, 1)
			go func() {
				for sent.Load() < total {
					if _, err := r.conn.Write(batch.Bytes()); err != nil {
						wrote <- err
						return
					}
					sent.Add(1000)
				}
				wrote <- nil
			}()
			r.expectGoAway(http2.ErrCodeEnhanceYourCalm)
			if err := <-wrote; err == nil {
				t.Fatalf("server read all %d CONTINUATION frames", total)
			}
			t.Logf("%d frames written before the server hung up", sent.Load())
		})
	}
}

// A header block that stalls halfway ends the connection after the header
// timeout, even with keepalive off.
func TestConformanceHeaderBlockTimeout(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, func(o *ServerOptions) {
		o.HeaderTimeout = 300 * time.Millisecond
		o.ReadIdleTimeout = -1
	})
	r := dialRaw(t, m, addr, true)
	r.connect(1, "10.0.0.1:80")
	r.expectStatus(1, "200")
	time.Sleep(600 * time.Millisecond) // a complete block lifted the timeout
	r.expectQuiet()
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: r.block(":method", "CONNECT")})
	start := time.Now()
	for {
		if _, err := r.fr.ReadFrame(); err != nil {
			break
		}
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("stalled header block kept for %v", d)
	}
}

// Frames carrying a header block that cannot be decoded end the
// connection: the HPACK context is lost.
func TestConformanceBadHeadersFrame(t *testing.T) {
	m := newMesh(t)
	_, addr := startServer(t, m, holdHandler, nil)
	r := dialRaw(t, m, addr, true)
	// Padding longer than the payload (RFC 9113 §6.2).
	r.fr.WriteRawFrame(http2.FrameHeaders, http2.FlagHeadersPadded|http2.FlagHeadersEndHeaders, 1,
		append([]byte{200}, strings.Repeat("x", 10)...))
	r.expectGoAway(http2.ErrCodeProtocol)
}
