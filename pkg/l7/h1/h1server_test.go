package h1

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
)

// h1Front serves HTTP/1.1 on a loopback listener with Serve, as the engine's ServeConn
// does for a connection that is not an HBONE stream.
func h1Front(t testing.TB, h http.Handler, limits Limits, log *zap.Logger) string {
	t.Helper()
	ln := testnet.Listen(t, "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	testnet.Serve(t, ln, func(c net.Conn) {
		ac := NewAheadConn(c)
		Serve(ctx, nil, ac, ac, h, limits, log)
	})
	return ln.Addr().String()
}

var testLimits = Limits{ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: 1 << 10}

// seen is what the echo handler of the differential tests received.
type seen struct {
	Method, RequestURI, URL, Proto, Host string
	Header, Trailer                      http.Header
	ContentLength                        int64
	TransferEncoding                     []string
	Close                                bool
	Body                                 string
	BodyErr                              bool
}

// echoHandler answers every request with what it saw, in a header (no
// body: a HEAD answer parses like any other). Under /noread it leaves the
// body unread behind a wrapper, as the engine may.
var echoHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	var body []byte
	var err error
	if strings.HasPrefix(r.URL.Path, "/noread") {
		r.Body = io.NopCloser(r.Body)
	} else {
		body, err = io.ReadAll(io.LimitReader(r.Body, 1<<20))
	}
	s := seen{Method: r.Method, RequestURI: r.RequestURI, URL: r.URL.String(), Proto: r.Proto, Host: r.Host,
		Header: r.Header, Trailer: r.Trailer, ContentLength: r.ContentLength, TransferEncoding: r.TransferEncoding,
		Close: r.Close, Body: string(body), BodyErr: err != nil}
	js, _ := json.Marshal(s)
	w.Header().Set("X-Seen", base64.StdEncoding.EncodeToString(js))
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
})

// netHTTPFront serves the same handler with net/http's server.
func netHTTPFront(t testing.TB, h http.Handler, limits Limits) string {
	t.Helper()
	ln := testnet.Listen(t, "127.0.0.1:0")
	srv := &http.Server{Handler: h, ReadHeaderTimeout: limits.ReadHeaderTimeout, IdleTimeout: limits.IdleTimeout,
		MaxHeaderBytes: limits.MaxHeaderBytes, ErrorLog: nil}
	srv.SetKeepAlivesEnabled(true)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// answers parses a server's output: each response's status and what the
// handler saw ("" for a response the handler did not write).
func answers(out string) []string {
	var got []string
	br := bufio.NewReader(strings.NewReader(out))
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if out := strings.TrimSpace(mustRead(br)); out != "" || !errors.Is(err, io.EOF) {
				got = append(got, "unparsable: "+err.Error())
			}
			return got
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		s := resp.Header.Get("X-Seen")
		if s == "" {
			// Refused: the status; the wording is not compared.
			got = append(got, "refused "+strconv.Itoa(resp.StatusCode))
			continue
		}
		js, _ := base64.StdEncoding.DecodeString(s)
		got = append(got, resp.Status+" "+string(js))
	}
}

func mustRead(r io.Reader) string {
	b, _ := io.ReadAll(r)
	return string(b)
}

// divergesByDesign: HTTP/2's preface (sniffed before Serve in
// ServeConn), faulty framing (Transfer-Encoding with Content-Length or in
// HTTP/1.0: refused) and the Host rules (readRequest): an empty host is refused;
// an absolute- or authority-form target's authority is taken whatever the
// Host field says, and must be a valid host (net/http checks the Host
// field instead).
func divergesByDesign(raw string, want, got []string) bool {
	if emptyHost.MatchString(raw) {
		return true
	}
	notOriginForm := func(a string) bool {
		return strings.Contains(a, `"RequestURI":"`) && !strings.Contains(a, `"RequestURI":"/`)
	}
	for i := range min(len(want), len(got)) {
		w, g := want[i], got[i]
		switch {
		case strings.Contains(w, `"Method":"PRI"`):
			return true
		case g == "refused 400" && w != g && faultyFraming.MatchString(raw) &&
			(lengthField.MatchString(raw) || strings.Contains(raw, " HTTP/1.0")):
			return true // Transfer-Encoding with Content-Length, or in HTTP/1.0 (framingScan)
		case w == "refused 400" && notOriginForm(g), g == "refused 400" && notOriginForm(w):
			return true
		}
	}
	return false
}

var (
	emptyHost     = regexp.MustCompile(`(?im)^host:[ \t]*\r?$`)
	faultyFraming = regexp.MustCompile(`(?im)^transfer-encoding:`)
	lengthField   = regexp.MustCompile(`(?im)^content-length:`)
)

// Serve answers what net/http's server answers: the same requests reach
// the handler with the same method, target, header, body and trailers, and
// the same inputs are refused with the same status. Divergences by design:
// the Host rules (readRequest) and HTTP/2's preface (sniffed before
// Serve in the engine's ServeConn).
func FuzzServeH1(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /x?q=1 HTTP/1.1\r\nHost: a\r\nX: 1\r\nX: 2\r\n\r\nGET /y HTTP/1.1\r\nHost: a\r\n\r\n",
		"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nT: v\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
		"POST / HTTP/1.1\r\nHost: a\r\nExpect: something\r\nContent-Length: 2\r\n\r\nhi",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX : y\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n folded\r\n\r\n",
		"GET / HTTP/1.1\nHost: a\n\n",
		"GET / HTTP/3.0\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("v", 3000) + "\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
		"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
		"G@T / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /%zz HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nPragma: no-cache\r\n\r\n",
		"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"0 * HTTP/0.0",                // cut short: 400, not silence
		"GET / HTTP/1.1\nHost:0\n\n0", // less than 4 bytes, then the end: no request
		"POST /noread HTTP/1.1\r\nHost: a\r\nContent-Length: 33\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /noread HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n21\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /noread HTTP/1.1\r\nHost: a\r\nContent-Length: 300000\r\n\r\n" + strings.Repeat("x", 300000) + "GET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		f.Add(s)
	}
	ours := h1Front(f, echoHandler, testLimits, zap.NewNop())
	theirs := netHTTPFront(f, echoHandler, testLimits)
	f.Fuzz(func(t *testing.T, raw string) {
		want := answers(testnet.Exchange(t, theirs, raw))
		got := answers(testnet.Exchange(t, ours, raw))
		if divergesByDesign(raw, want, got) {
			return
		}
		if !slices.Equal(got, want) {
			t.Fatalf("input %q\nServe:\n%s\nnet/http:\n%s", raw, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// readAnswers reads one response per method from a server's output.
func readAnswers(t *testing.T, out string, methods ...string) []*http.Response {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(out))
	var resps []*http.Response
	for _, m := range methods {
		resp, err := http.ReadResponse(br, &http.Request{Method: m})
		if err != nil {
			t.Fatalf("response %d of %q: %v", len(resps)+1, out, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("response %d body of %q: %v", len(resps)+1, out, err)
		}
		resp.Body = io.NopCloser(strings.NewReader(string(body)))
		resps = append(resps, resp)
	}
	if rest := mustRead(br); rest != "" {
		t.Fatalf("unexpected bytes after %d responses: %q", len(methods), rest)
	}
	return resps
}

func bodyOf(r *http.Response) string { return mustRead(r.Body) }

// The response's framing and connection handling, as net/http's server
// frames a response (except that nothing is buffered to guess a length).
func TestH1ResponseFraming(t *testing.T) {
	var lastWriteErr atomic.Value
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		note := func(_ int, err error) {
			if err != nil {
				lastWriteErr.Store(err.Error())
			}
		}
		switch r.URL.Path {
		case "/stream":
			note(io.WriteString(w, "hello"))
		case "/length":
			w.Header().Set("Content-Length", "5")
			note(io.WriteString(w, "hello"))
		case "/nocontent":
			w.Header().Set("Content-Length", "5")
			w.WriteHeader(http.StatusNoContent)
			note(io.WriteString(w, "hello"))
		case "/notmodified":
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusNotModified)
		case "/badlength":
			w.Header().Set("Content-Length", "abc")
			note(io.WriteString(w, "hello"))
		case "/inject":
			w.Header().Set("X-Value", "a\r\nX-Injected: 1")
			w.Header()["Bad Name"] = []string{"x"}
		case "/trailers":
			w.Header().Set("Trailer", "A")
			w.WriteHeader(http.StatusOK)
			note(io.WriteString(w, "body"))
			w.Header().Set("A", "1")
			w.Header().Set(http.TrailerPrefix+"B", "2")
		case "/short":
			w.Header().Set("Content-Length", "10")
			note(io.WriteString(w, "hello"))
		case "/long":
			w.Header().Set("Content-Length", "2")
			note(io.WriteString(w, "hello"))
		case "/date":
			w.Header().Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT")
		case "/early":
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			note(io.WriteString(w, "final"))
		case "/close":
			w.Header().Set("Connection", "close")
		}
	})
	addr := h1Front(t, h, testLimits, zap.NewNop())
	get := func(path, proto string, extra ...string) string {
		return "GET " + path + " " + proto + "\r\nHost: a\r\n" + strings.Join(extra, "") + "\r\n"
	}
	next := get("/next", "HTTP/1.1")

	t.Run("chunked without a length", func(t *testing.T) {
		rs := readAnswers(t, testnet.Exchange(t, addr, get("/stream", "HTTP/1.1")+next), "GET", "GET")
		if te := rs[0].TransferEncoding; !slices.Equal(te, []string{"chunked"}) || bodyOf(rs[0]) != "hello" {
			t.Fatalf("transfer encoding %v", te)
		}
		if rs[0].Header.Get("Date") == "" {
			t.Fatal("no Date")
		}
	})
	t.Run("HTTP/1.0 without a length ends with the connection", func(t *testing.T) {
		out := testnet.Exchange(t, addr, get("/stream", "HTTP/1.0", "Connection: keep-alive\r\n")+next)
		rs := readAnswers(t, out, "GET")
		if len(rs[0].TransferEncoding) != 0 || !rs[0].Close || bodyOf(rs[0]) != "hello" {
			t.Fatalf("%q", out)
		}
	})
	t.Run("HTTP/1.0 keep-alive with a length", func(t *testing.T) {
		rs := readAnswers(t, testnet.Exchange(t, addr, get("/length", "HTTP/1.0", "Connection: keep-alive\r\n")+next), "GET", "GET")
		if rs[0].Header.Get("Connection") != "keep-alive" || bodyOf(rs[0]) != "hello" {
			t.Fatalf("%v", rs[0].Header)
		}
	})
	t.Run("no body for 204 and 304", func(t *testing.T) {
		lastWriteErr.Store("")
		rs := readAnswers(t, testnet.Exchange(t, addr, get("/nocontent", "HTTP/1.1")+get("/notmodified", "HTTP/1.1")+next), "GET", "GET", "GET")
		if rs[0].StatusCode != 204 || rs[0].Header.Get("Content-Length") != "" || bodyOf(rs[0]) != "" {
			t.Fatalf("204: %v", rs[0].Header)
		}
		if lastWriteErr.Load() != http.ErrBodyNotAllowed.Error() {
			t.Fatalf("writing a 204's body: %v", lastWriteErr.Load())
		}
		if rs[1].StatusCode != 304 || rs[1].Header.Get("Content-Type") != "" {
			t.Fatalf("304: %v", rs[1].Header)
		}
	})
	t.Run("HEAD keeps the length, sends no body", func(t *testing.T) {
		head := strings.Replace(get("/length", "HTTP/1.1"), "GET", "HEAD", 1)
		rs := readAnswers(t, testnet.Exchange(t, addr, head+next), "HEAD", "GET")
		if rs[0].ContentLength != 5 {
			t.Fatalf("HEAD: %v", rs[0].Header)
		}
	})
	t.Run("invalid length dropped", func(t *testing.T) {
		rs := readAnswers(t, testnet.Exchange(t, addr, get("/badlength", "HTTP/1.1")+next), "GET", "GET")
		if !slices.Equal(rs[0].TransferEncoding, []string{"chunked"}) || bodyOf(rs[0]) != "hello" {
			t.Fatalf("%v", rs[0].Header)
		}
	})
	t.Run("no response splitting", func(t *testing.T) {
		rs := readAnswers(t, testnet.Exchange(t, addr, get("/inject", "HTTP/1.1")+next), "GET", "GET")
		if rs[0].Header.Get("X-Injected") != "" || rs[0].Header.Get("X-Value") != "a  X-Injected: 1" || rs[0].Header.Get("Bad Name") != "" {
			t.Fatalf("%v", rs[0].Header)
		}
	})
	t.Run("trailers", func(t *testing.T) {
		rs := readAnswers(t, testnet.Exchange(t, addr, get("/trailers", "HTTP/1.1")+next), "GET", "GET")
		if bodyOf(rs[0]) != "body" || rs[0].Trailer.Get("A") != "1" || rs[0].Trailer.Get("B") != "2" {
			t.Fatalf("trailers %v", rs[0].Trailer)
		}
	})
	t.Run("short body ends the connection", func(t *testing.T) {
		out := testnet.Exchange(t, addr, get("/short", "HTTP/1.1")+next)
		if !strings.HasSuffix(out, "\r\n\r\nhello") {
			t.Fatalf("%q", out)
		}
	})
	t.Run("no more than the length, and then a short body", func(t *testing.T) {
		lastWriteErr.Store("")
		out := testnet.Exchange(t, addr, get("/long", "HTTP/1.1")+next)
		if !strings.HasSuffix(out, "\r\n\r\n") || lastWriteErr.Load() != http.ErrContentLength.Error() {
			t.Fatalf("%q, write error %v", out, lastWriteErr.Load())
		}
	})
	t.Run("the handler's Date", func(t *testing.T) {
		rs := readAnswers(t, testnet.Exchange(t, addr, get("/date", "HTTP/1.1")+next), "GET", "GET")
		if d := rs[0].Header.Values("Date"); !slices.Equal(d, []string{"Mon, 02 Jan 2006 15:04:05 GMT"}) {
			t.Fatalf("Date %v", d)
		}
	})
	t.Run("interim responses", func(t *testing.T) {
		out := testnet.Exchange(t, addr, get("/early", "HTTP/1.1"))
		if !strings.HasPrefix(out, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n") {
			t.Fatalf("%q", out)
		}
		out = testnet.Exchange(t, addr, get("/early", "HTTP/1.0"))
		if !strings.HasPrefix(out, "HTTP/1.0 200 OK\r\n") {
			t.Fatalf("an HTTP/1.0 client got an interim response: %q", out)
		}
	})
	t.Run("Connection: close from the handler", func(t *testing.T) {
		rs := readAnswers(t, testnet.Exchange(t, addr, get("/close", "HTTP/1.1")+next), "GET")
		if !rs[0].Close {
			t.Fatal("not closed")
		}
	})
}

// When a connection is kept for the next request and when it ends.
func TestH1Connection(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	cancelled := make(chan string, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/read":
			_, _ = io.ReadAll(r.Body)
		case "/panic":
			panic("handler bug")
		case "/abort":
			panic(http.ErrAbortHandler)
		case "/wait":
			select {
			case <-r.Context().Done():
				cancelled <- r.URL.RawQuery
			case <-time.After(300 * time.Millisecond):
			}
		case "/hijack":
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			_ = brw.Flush()
			rest, _ := io.ReadAll(conn)
			io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(rest))+"\r\n\r\n"+string(rest))
		}
	})
	limits := Limits{ReadHeaderTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond, MaxHeaderBytes: 1 << 10}
	addr := h1Front(t, h, limits, zap.New(core))
	next := "GET /next HTTP/1.1\r\nHost: a\r\n\r\n"
	post := func(path string, body int, extra ...string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: a\r\nContent-Length: " + strconv.Itoa(body) + "\r\n" + strings.Join(extra, "") + "\r\n" + strings.Repeat("b", body)
	}

	t.Run("an unread small body is drained", func(t *testing.T) {
		readAnswers(t, testnet.Exchange(t, addr, post("/", 1000)+next), "POST", "GET")
	})
	t.Run("an unread large body ends the connection", func(t *testing.T) {
		out := testnet.Exchange(t, addr, post("/", 300<<10)+next)
		if strings.Count(out, "HTTP/1.1 200") != 1 {
			t.Fatalf("%q", out)
		}
	})
	t.Run("100-continue", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
		br := bufio.NewReader(c)
		line, _ := br.ReadString('\n')
		if line != "HTTP/1.1 100 Continue\r\n" {
			t.Fatalf("before the body: %q", line)
		}
		br.ReadString('\n')
		io.WriteString(c, "body"+next)
		c.(*net.TCPConn).CloseWrite()
		readAnswers(t, mustRead(br), "POST", "GET")
	})
	t.Run("100-continue never asked for ends the connection", func(t *testing.T) {
		out := testnet.Exchange(t, addr, post("/", 4, "Expect: 100-continue\r\n")+next)
		if strings.Contains(out, "100 Continue") || strings.Count(out, "HTTP/1.1 200") != 1 {
			t.Fatalf("%q", out)
		}
	})
	t.Run("faulty framing is refused and ends the connection", func(t *testing.T) {
		for _, raw := range []string{
			"POST /read HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
			"POST /read HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
			"POST /read HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
			"POST /read HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
		} {
			rs := readAnswers(t, testnet.Exchange(t, addr, raw+next), "POST")
			if rs[0].StatusCode != http.StatusBadRequest || !rs[0].Close {
				t.Fatalf("%q: %d (close %v), want 400 and the connection closed", raw, rs[0].StatusCode, rs[0].Close)
			}
		}
	})
	t.Run("a panic ends the connection and is logged; an abort is not", func(t *testing.T) {
		for _, p := range []string{"/panic", "/abort"} {
			if out := testnet.Exchange(t, addr, "GET "+p+" HTTP/1.1\r\nHost: a\r\n\r\n"+next); out != "" {
				t.Fatalf("%s: %q", p, out)
			}
		}
		if n := logs.FilterMessage("panic serving a request").Len(); n != 1 {
			t.Fatalf("%d panics logged", n)
		}
	})
	t.Run("header too large", func(t *testing.T) {
		out := testnet.Exchange(t, addr, "GET / HTTP/1.1\r\nHost: a\r\nX: "+strings.Repeat("v", 6000)+"\r\n\r\n")
		if !strings.HasPrefix(out, "HTTP/1.1 431 ") {
			t.Fatalf("%q", out)
		}
	})
	t.Run("timeouts", func(t *testing.T) {
		for _, raw := range []string{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "GET / HTTP/1.1\r\nHo"} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			start := time.Now()
			io.WriteString(c, raw)
			out := mustRead(c) // no half-close: the server must end it
			c.Close()
			if d := time.Since(start); d < 250*time.Millisecond || d > 5*time.Second {
				t.Fatalf("%q closed after %v", raw, d)
			}
			if strings.Count(out, "HTTP/1.1 200") != strings.Count(raw, "\r\n\r\n") {
				t.Fatalf("%q: %q", raw, out)
			}
		}
	})
	t.Run("a client that ends its direction still gets its answers", func(t *testing.T) {
		out := testnet.Exchange(t, addr, "GET /wait?1 HTTP/1.1\r\nHost: a\r\n\r\nGET /wait?2 HTTP/1.1\r\nHost: a\r\n\r\n")
		readAnswers(t, out, "GET", "GET")
		if len(cancelled) != 0 {
			t.Fatalf("request %s cancelled", <-cancelled)
		}
	})
	t.Run("a client that resets cancels its request", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET /wait?3 HTTP/1.1\r\nHost: a\r\n\r\n")
		time.Sleep(50 * time.Millisecond) // the request is being served
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		select {
		case q := <-cancelled:
			if q != "3" {
				t.Fatalf("request %s cancelled", q)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the request was not cancelled")
		}
	})
	t.Run("a hijacker reads what the client sent ahead", func(t *testing.T) {
		rs := readAnswers(t, testnet.Exchange(t, addr, "GET /hijack HTTP/1.1\r\nHost: a\r\n\r\nsent ahead"), "GET")
		if b := bodyOf(rs[0]); b != "sent ahead" {
			t.Fatalf("hijacker read %q", b)
		}
	})
}

// AheadConn's reader ends with the connection, also when what it read
// ahead is never taken.
func TestAheadConnCloseEndsReader(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 20 {
		a, b := net.Pipe()
		ac := NewAheadConn(a)
		go b.Write([]byte("never read"))
		<-ac.ready // read ahead, waiting to be taken
		ac.ready <- struct{}{}
		ac.Close()
		b.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// failingPeer reports its tunnel failed once fail is called, while the
// socket under it still carries what the server writes: a request
// cancelled that way must get no answer made up for it.
type failingPeer struct {
	*AheadConn
	done context.Context
}

func (p failingPeer) PeerDone() context.Context { return p.done }

func (p failingPeer) Read(b []byte) (int, error) {
	if len(b) == 0 && p.done.Err() != nil {
		return 0, errors.New("stream reset")
	}
	return p.AheadConn.Read(b)
}

func TestH1NoAnswerMadeUpForACancelledRequest(t *testing.T) {
	done, fail := context.WithCancel(context.Background())
	defer fail()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fail()
		<-r.Context().Done() // and returns without a word, as a cancelled exchange does
	})
	ln := testnet.Listen(t, "127.0.0.1:0")
	testnet.Serve(t, ln, func(c net.Conn) {
		ac := NewAheadConn(c)
		defer ac.Close()
		Serve(context.Background(), nil, ac, failingPeer{ac, done}, h, testLimits, zap.NewNop())
	})
	c := testnet.Dial(t, ln.Addr().String())
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if out := mustRead(c); out != "" {
		t.Fatalf("a cancelled request was answered %q", out)
	}
}
