package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
)

// rawUpstream serves each accepted connection with serve and counts them.
type rawUpstream struct {
	ln    net.Listener
	conns atomic.Int32
}

func startRawUpstream(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) *rawUpstream {
	t.Helper()
	u := &rawUpstream{ln: testnet.Listen(t, "127.0.0.1:0")}
	testnet.Serve(t, u.ln, func(c net.Conn) {
		u.conns.Add(1)
		serve(c, bufio.NewReader(c))
	})
	return u
}

func (u *rawUpstream) client(idle time.Duration) *Client {
	return &Client{
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", u.ln.Addr().String())
		},
		IdleTimeout:    idle,
		MaxHeaderBytes: 4 << 10,
	}
}

// answer reads requests and answers each with respond's raw bytes until
// respond returns "" or the client goes away.
func answer(respond func(n int, req *http.Request) string) func(net.Conn, *bufio.Reader) {
	return func(c net.Conn, br *bufio.Reader) {
		for n := 0; ; n++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			out := respond(n, req)
			if out == "" {
				return
			}
			if _, err := io.WriteString(c, out); err != nil {
				return
			}
		}
	}
}

func okResponse(body string) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

func inlineGet(t *testing.T, h *Client, ctx context.Context, method string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, "http://backend/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := h.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), err
}

func TestInlineH1ReusesKeepAliveConnections(t *testing.T) {
	u := startRawUpstream(t, answer(func(n int, req *http.Request) string {
		out := okResponse(fmt.Sprint(req.Method, " ", n))
		if req.Method == "HEAD" {
			out = out[:strings.Index(out, "\r\n\r\n")+4] // the header without the body
		}
		return out
	}))
	h := u.client(time.Minute)
	for i, method := range []string{"GET", "HEAD", "DELETE", "GET"} {
		resp, body, err := inlineGet(t, h, context.Background(), method)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", method, resp, err)
		}
		want := fmt.Sprint(method, " ", i)
		if method == "HEAD" {
			want = ""
		}
		if body != want {
			t.Fatalf("%s: body %q, want %q", method, body, want)
		}
	}
	if n := u.conns.Load(); n != 1 {
		t.Fatalf("%d connections for four sequential requests, want one kept alive", n)
	}
}

// The upstream closed an idle keep-alive connection: a GET goes once more
// on a new connection; a POST, which may not be replayed, fails.
func TestInlineH1StaleConnection(t *testing.T) {
	u := startRawUpstream(t, answer(func(n int, req *http.Request) string {
		if n == 1 {
			return "" // close instead of answering the second request
		}
		return okResponse("fine")
	}))
	h := u.client(time.Minute)
	if _, body, err := inlineGet(t, h, context.Background(), "GET"); err != nil || body != "fine" {
		t.Fatalf("first GET: %q %v", body, err)
	}
	if _, body, err := inlineGet(t, h, context.Background(), "GET"); err != nil || body != "fine" {
		t.Fatalf("GET on a connection the upstream closed: %q, %v; want it replayed on a new connection", body, err)
	}
	if n := u.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
	if _, _, err := inlineGet(t, h, context.Background(), "POST"); err == nil {
		t.Fatal("a POST on a connection the upstream closed was replayed")
	}
}

func TestInlineH1DoesNotReuseAfterAnUnreadBodyOrClose(t *testing.T) {
	u := startRawUpstream(t, answer(func(n int, req *http.Request) string {
		if req.URL.Query().Get("close") != "" {
			return "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
		}
		return okResponse(strings.Repeat("x", 1000))
	}))
	h := u.client(time.Minute)
	req, _ := http.NewRequest("GET", "http://backend/big", nil)
	resp, err := h.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // unread
	req, _ = http.NewRequest("GET", "http://backend/x?close=1", nil)
	resp, err = h.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if _, _, err := inlineGet(t, h, context.Background(), "GET"); err != nil {
		t.Fatal(err)
	}
	if n := u.conns.Load(); n != 3 {
		t.Fatalf("%d connections, want 3: none reused after an unread body or Connection: close", n)
	}
}

func TestInlineH1ContextInterruptsAStalledUpstream(t *testing.T) {
	u := startRawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		http.ReadRequest(br)
		io.Copy(io.Discard, br) // never answers; waits for the connection to close
	})
	h := u.client(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := inlineGet(t, h, ctx, "GET")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("stalled upstream: %v after %v; want the deadline error promptly", err, time.Since(start))
	}
	if h.take() != nil {
		t.Fatal("the interrupted connection went back to the idle list")
	}
}

func TestInlineH1BoundsTheResponseHeader(t *testing.T) {
	u := startRawUpstream(t, answer(func(int, *http.Request) string {
		return "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\nContent-Length: 0\r\n\r\n"
	}))
	if _, _, err := inlineGet(t, u.client(time.Minute), context.Background(), "GET"); !errors.Is(err, errHeaderTooLarge) {
		t.Fatalf("8 KiB header with a 4 KiB limit: %v", err)
	}
}

func TestInlineH1InformationalResponses(t *testing.T) {
	u := startRawUpstream(t, answer(func(n int, req *http.Request) string {
		if req.URL.Path == "/many" {
			return strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", max1xx+1) + okResponse("late")
		}
		if req.URL.Path == "/switch" {
			return "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n"
		}
		return "HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n" + okResponse("final")
	}))
	h := u.client(time.Minute)
	var hints []string
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, hdr textproto.MIMEHeader) error {
			hints = append(hints, fmt.Sprint(code, " ", hdr.Get("Link")))
			return nil
		},
	})
	resp, body, err := inlineGet(t, h, ctx, "GET")
	if err != nil || resp.StatusCode != 200 || body != "final" {
		t.Fatalf("after a 103: %v %q %v", resp, body, err)
	}
	if len(hints) != 1 || hints[0] != "103 </style.css>" {
		t.Fatalf("1xx seen by the trace: %q", hints)
	}
	for _, path := range []string{"/many", "/switch"} {
		req, _ := http.NewRequest("GET", "http://backend"+path, nil)
		if _, err := h.RoundTrip(req); err == nil {
			t.Fatalf("%s: accepted", path)
		}
	}
}

func TestInlineH1IdleTimeout(t *testing.T) {
	closed := make(chan struct{}, 1)
	u := startRawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		answer(func(int, *http.Request) string { return okResponse("x") })(c, br)
		closed <- struct{}{}
	})
	h := u.client(100 * time.Millisecond)
	if _, _, err := inlineGet(t, h, context.Background(), "GET"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("an idle connection outlived the idle timeout")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.idle) != 0 {
		t.Fatalf("%d connections still idle", len(h.idle))
	}
}

func TestH1PlainTakesOnlyBodylessNonUpgradeRequests(t *testing.T) {
	mk := func(method string, body io.Reader, hdr ...string) *http.Request {
		r, _ := http.NewRequest(method, "http://backend/", body)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return r
	}
	for _, c := range []struct {
		req  *http.Request
		want bool
	}{
		{mk("GET", nil), true},
		{mk("HEAD", nil), true},
		{mk("DELETE", nil), false},
		{mk("DELETE", nil, "Idempotency-Key", "k1"), true},
		{mk("POST", strings.NewReader("x")), false},
		{mk("GET", nil, "Upgrade", "websocket", "Connection", "Upgrade"), false},
	} {
		if got := Inlinable(c.req, FieldsOf(c.req.Header)); got != c.want {
			t.Errorf("%s with %v: %v, want %v", c.req.Method, c.req.Header, got, c.want)
		}
	}
}

func TestInlineH1RefusesInvalidHeaders(t *testing.T) {
	u := startRawUpstream(t, answer(func(int, *http.Request) string { return okResponse("x") }))
	h := u.client(time.Minute)
	for _, hdr := range []http.Header{
		{"X-Bad Name": {"v"}},
		{"X-Ok": {"line\r\nInjected: 1"}},
	} {
		req, _ := http.NewRequest("GET", "http://backend/", nil)
		req.Header = hdr
		if _, err := h.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "invalid header field") {
			t.Errorf("%v: %v", hdr, err)
		}
	}
	time.Sleep(50 * time.Millisecond) // an accept would have been counted by now
	if n := u.conns.Load(); n != 0 {
		t.Errorf("%d connections opened for refused requests", n)
	}
}

// FuzzWriteHead checks that writeHead writes, byte for byte, what
// Request.Write writes for a request without a body whose header fields
// validHeaders accepts, and fails where it fails.
func FuzzWriteHead(f *testing.F) {
	f.Add("GET", "/a?b=c", "web", "X-A", "1", "2", "", false)
	f.Add("POST", "/", "[fe80::1%25en0]:80", "User-Agent", "", "x", "", false)
	f.Add("OPTIONS", "*", "bücher.example", "Connection", "keep-alive close", "", "", true)
	f.Add("CONNECT", "", "backend:443", "Te", "trailers", "", "backend:443", false)
	f.Add("HEAD", "/%zz", "bad host\x01", "Trailer", "X", "", "", true)
	f.Fuzz(func(t *testing.T, method, target, host, key, v1, v2, opaque string, closeConn bool) {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			u = &url.URL{Path: target}
		}
		u.Opaque = opaque
		// More than one field, so that their order counts.
		req := &http.Request{Method: method, URL: u, Host: host, Header: http.Header{"Accept": {"*/*"}, "X-Z": {"z"}}, Close: closeConn}
		if key != "" {
			req.Header[textproto.CanonicalMIMEHeaderKey(key)] = []string{v1, v2}[:1+len(v2)%2]
		}
		if validHeaders(FieldsOf(req.Header)) != nil {
			return
		}
		var want, got bytes.Buffer
		werr := req.Write(&want)
		bw := bufio.NewWriter(&got)
		gerr := writeHead(bw, req, FieldsOf(req.Header))
		_ = bw.Flush()
		switch {
		case werr != nil && gerr == nil:
			t.Fatalf("Request.Write failed (%v), writeHead wrote %q", werr, got.String())
		case werr == nil && gerr != nil:
			t.Fatalf("writeHead failed (%v), Request.Write wrote %q", gerr, want.String())
		case werr == nil && !bytes.Equal(want.Bytes(), got.Bytes()):
			t.Fatalf("heads differ:\nRequest.Write %q\nwriteHead     %q", want.String(), got.String())
		}
	})
}

// BenchmarkWriteHead compares writeHead with Request.Write (the baseline)
// on a request as the waypoint forwards it.
func BenchmarkWriteHead(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://127.0.0.1:8080/bench/item?x=1", nil)
	req.Host = "bench.svc"
	for k, v := range map[string]string{"Accept": "*/*", "User-Agent": "load/1.0", "X-Request-Id": "abc",
		"X-Forwarded-For": "10.0.0.1", "Forwarded": `for="10.0.0.1:1234"`, "X-Causeway-Source-Principal": "spiffe://cluster.local/ns/a/sa/b"} {
		req.Header.Set(k, v)
	}
	bw := bufio.NewWriter(io.Discard)
	fields := FieldsOf(req.Header)
	b.Run("Request.Write", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = req.Write(bw)
		}
	})
	b.Run("writeHead", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = writeHead(bw, req, fields)
		}
	})
}

// An upstream that sends anything on a connection with no exchange in
// flight (an extra response after a complete one, a body after a HEAD
// answer or after a 204 or 304), with the response or while the
// connection idles: the connection is discarded, and the next request gets
// its own answer on a new one (net/http's Transport does the same).
func TestInlineH1DiscardsConnectionsThatReceivedWhileIdle(t *testing.T) {
	for _, c := range []struct {
		name, method, head, extra string
	}{
		{"extra response", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nmine", okResponse("STALE")},
		{"body after HEAD", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "STALE"},
		{"bytes after 204", "GET", "HTTP/1.1 204 No Content\r\n\r\n", okResponse("STALE")},
		{"bytes after 304", "GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", "STALE"},
		{"a lone CRLF", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nmine", "\r\n"},
	} {
		for _, later := range []bool{false, true} {
			name := c.name + " with the response"
			if later {
				name = c.name + " while idle"
			}
			t.Run(name, func(t *testing.T) {
				idle := make(chan struct{})
				sent := make(chan struct{})
				var accepted atomic.Int32
				u := startRawUpstream(t, func(conn net.Conn, br *bufio.Reader) {
					if accepted.Add(1) > 1 {
						answer(func(_ int, req *http.Request) string { return okResponse(req.URL.Path) })(conn, br)
						return
					}
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					if !later {
						io.WriteString(conn, c.head+c.extra)
					} else {
						io.WriteString(conn, c.head)
						<-idle
						io.WriteString(conn, c.extra)
						time.Sleep(20 * time.Millisecond) // for the bytes to reach the client's socket
						close(sent)
					}
					answer(func(_ int, req *http.Request) string { return okResponse(req.URL.Path) })(conn, br)
				})
				h := u.client(time.Minute)
				req, _ := http.NewRequest(c.method, "http://backend/first", nil)
				resp, err := h.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				io.ReadAll(resp.Body)
				resp.Body.Close()
				close(idle)
				if later {
					<-sent
				}
				req, _ = http.NewRequest("GET", "http://backend/second", nil)
				resp, err = h.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(body) != "/second" {
					t.Fatalf("second request answered %d %q, want its own 200 /second", resp.StatusCode, body)
				}
				if n := u.conns.Load(); n != 2 {
					t.Fatalf("%d connections, want 2: the one that received bytes while idle is not reused", n)
				}
			})
		}
	}
}
