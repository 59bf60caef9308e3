package l7

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// recordingBackend is a raw HTTP/1.1 upstream that records what reached it:
// every byte, and each request it parsed from them. It answers each
// request with respond's bytes: by default a 200 whose body is the
// request's target, so that a response shows which request it answers.
type recordingBackend struct {
	addr netip.AddrPort
	// respond is the raw answer to a request (n counts the connection's
	// requests from 0); later, when not nil, is written on the connection
	// once the answer has been read by the waypoint, and wrote is then
	// signalled.
	respond func(n int, req *http.Request) (answer string, later string)
	wrote   chan struct{}

	mu   sync.Mutex
	raw  bytes.Buffer
	reqs []string
}

func startRecordingBackend(t *testing.T) *recordingBackend {
	t.Helper()
	b := &recordingBackend{wrote: make(chan struct{}, 16)}
	b.respond = func(_ int, req *http.Request) (string, string) { return okAnswer(req), "" }
	ln := testnet.Listen(t, "127.0.0.1:0")
	b.addr = netip.MustParseAddrPort(ln.Addr().String())
	testnet.Serve(t, ln, b.serve)
	return b
}

// okAnswer is a 200 naming req's target in its body.
func okAnswer(req *http.Request) string {
	return "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(req.RequestURI)) + "\r\n\r\n" + req.RequestURI
}

type teeRecorder struct {
	r io.Reader
	b *recordingBackend
}

func (t teeRecorder) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.b.mu.Lock()
	t.b.raw.Write(p[:n])
	t.b.mu.Unlock()
	return n, err
}

func (b *recordingBackend) serve(c net.Conn) {
	br := bufio.NewReader(teeRecorder{c, b})
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.Header.Get("Expect") != "" {
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		b.mu.Lock()
		b.reqs = append(b.reqs, summarize(req, body))
		b.mu.Unlock()
		answer, later := b.respond(n, req)
		if _, err := io.WriteString(c, answer); err != nil {
			return
		}
		if later != "" {
			time.Sleep(50 * time.Millisecond) // the waypoint reads the answer and lets the connection idle
			io.WriteString(c, later)
			time.Sleep(20 * time.Millisecond) // the bytes reach the waypoint's socket
			b.wrote <- struct{}{}
		}
	}
}

// summarize is what a test asserts of a request the backend received: its
// line, body framing and body, and the fields a case may be about.
func summarize(req *http.Request, body []byte) string {
	s := fmt.Sprintf("%s %s cl=%d te=%s body=%q", req.Method, req.RequestURI, req.ContentLength, strings.Join(req.TransferEncoding, ","), body)
	for _, k := range []string{"X", "Expect", "Content-Type"} {
		if vv, ok := req.Header[k]; ok {
			s += fmt.Sprintf(" %s=%q", k, vv)
		}
	}
	if len(req.Trailer) > 0 {
		s += fmt.Sprintf(" trailer=%v", req.Trailer)
	}
	return s
}

func (b *recordingBackend) received() ([]string, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.reqs), b.raw.String()
}

// readResponses reads a client's answers: "STATUS BODY" for a 200 (the
// body names the request it answers), "STATUS" for anything else,
// including each informational response. methods are the requests'
// methods, in order (HEAD answers have no body).
func readResponses(br *bufio.Reader, methods []string) ([]string, error) {
	var got []string
	for _, m := range methods {
		for {
			resp, err := http.ReadResponse(br, &http.Request{Method: m})
			if err != nil {
				return got, err
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return got, err
			}
			if resp.StatusCode == http.StatusOK {
				got = append(got, fmt.Sprintf("%d %s", resp.StatusCode, body))
			} else {
				got = append(got, strconv.Itoa(resp.StatusCode))
			}
			if resp.StatusCode >= 200 {
				break
			}
		}
	}
	return got, nil
}

// framingCase is a case of TestHTTP1Framing: its clients, one after
// another, and what the backend must have received.
type framingCase struct {
	name    string
	clients []framingClient
	respond func(n int, req *http.Request) (string, string)
	later   bool     // respond sends late bytes: each next client waits for them
	backend []string // the requests the backend received, in order
	notRaw  []string // must not be in the backend's bytes
}

// framingClient is one client connection of a framing case: what it sends
// (each string one write), the methods of its requests (to parse the
// answers) and the answers it must get, after which the connection must
// carry nothing more.
type framingClient struct {
	send    []string
	methods []string
	want    []string
}

// A table of HTTP/1.1 framing cases through the waypoint's HTTP/1.1 server
// and upstream clients to a raw backend: what each client is answered and
// what the backend received, request by request and byte by byte. Anything
// the waypoint refuses must not reach the backend, what it forwards must
// be framed as the waypoint read it, and no answer may reach a request
// other than the one it was for.
func TestHTTP1Framing(t *testing.T) {
	get := func(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: web\r\n\r\n" }
	post := func(path string, fields, body string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: web\r\n" + fields + "\r\n" + body
	}
	one := func(send, method string, want ...string) []framingClient {
		return []framingClient{{send: []string{send}, methods: []string{method}, want: want}}
	}
	bytewise := func(s string) []string {
		var out []string
		for i := range s {
			out = append(out, s[i:i+1])
		}
		return out
	}
	cases := []framingCase{
		{name: "CL and TE", clients: one(post("/a", "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", "0\r\n\r\n")+get("/next"), "POST", "400")},
		{name: "TE and CL, lower case", clients: one(post("/a", "content-length: 5\r\ntransfer-encoding: chunked\r\n", "0\r\n\r\n")+get("/next"), "POST", "400")},
		{name: "CL.TE smuggling", clients: one(post("/a", "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\nG")+get("/next"), "POST", "400")},
		{name: "TE in HTTP/1.0", clients: one("POST /a HTTP/1.0\r\nHost: web\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "POST", "400")},
		{name: "TE split over many writes", clients: []framingClient{{send: bytewise(post("/a", "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n")), methods: []string{"POST"}, want: []string{"400"}}}},
		{
			name: "duplicate equal CL",
			clients: []framingClient{{send: []string{post("/a", "Content-Length: 5\r\nContent-Length: 5\r\n", "hello") + get("/next")},
				methods: []string{"POST", "GET"}, want: []string{"200 /a", "200 /next"}}},
			backend: []string{`POST /a cl=5 te= body="hello"`, `GET /next cl=0 te= body=""`},
		},
		{name: "conflicting CL", clients: one(post("/a", "Content-Length: 5\r\nContent-Length: 6\r\n", "hello!"), "POST", "400")},
		{name: "CL list", clients: one(post("/a", "Content-Length: 5, 5\r\n", "hello"), "POST", "400")},
		{name: "CL with a sign", clients: one(post("/a", "Content-Length: +5\r\n", "hello"), "POST", "400")},
		{name: "CL not a number", clients: one(post("/a", "Content-Length: 0x5\r\n", "hello"), "POST", "400")},
		{name: "TE not chunked", clients: one(post("/a", "Transfer-Encoding: xchunked\r\n", "5\r\nhello\r\n0\r\n\r\n"), "POST", "501")},
		{name: "TE chunked then identity", clients: one(post("/a", "Transfer-Encoding: chunked, identity\r\n", "5\r\nhello\r\n0\r\n\r\n"), "POST", "501")},
		{name: "TE twice", clients: one(post("/a", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"), "POST", "501")},
		{name: "TE with space before the colon", clients: one(post("/a", "Transfer-Encoding : chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"), "POST", "400")},
		{name: "TE name with a control byte", clients: one(post("/a", "Transfer-Encoding\x0b: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"), "POST", "400")},
		{
			name: "TE with a tab and upper case",
			clients: []framingClient{{send: []string{post("/a", "Transfer-Encoding:\tCHUNKED\r\n", "5\r\nhello\r\n0\r\n\r\n") + get("/next")},
				methods: []string{"POST", "GET"}, want: []string{"200 /a", "200 /next"}}},
			backend: []string{`POST /a cl=-1 te=chunked body="hello"`, `GET /next cl=0 te= body=""`},
		},
		{
			name: "TE folded into another field",
			clients: []framingClient{{send: []string{"GET /a HTTP/1.1\r\nHost: web\r\nX: y\r\n Transfer-Encoding: chunked\r\n\r\n" + get("/next")},
				methods: []string{"GET", "GET"}, want: []string{"200 /a", "200 /next"}}},
			backend: []string{`GET /a cl=0 te= body="" X=["y Transfer-Encoding: chunked"]`, `GET /next cl=0 te= body=""`},
		},
		{name: "obs-fold at the first field", clients: one("GET /a HTTP/1.1\r\n X: y\r\nHost: web\r\n\r\n", "GET", "400")},
		{
			name:    "bare LF line ends",
			clients: []framingClient{{send: []string{"GET /a HTTP/1.1\nHost: web\nX: 1\n\n" + get("/next")}, methods: []string{"GET", "GET"}, want: []string{"200 /a", "200 /next"}}},
			backend: []string{`GET /a cl=0 te= body="" X=["1"]`, `GET /next cl=0 te= body=""`},
			notRaw:  []string{"\n\n", "X: 1\n"},
		},
		{name: "bare CR in a value", clients: one("GET /a HTTP/1.1\r\nHost: web\r\nX: 1\rTransfer-Encoding: chunked\r\n\r\n", "GET", "400")},
		{name: "bare CR line ends", clients: one("GET /a HTTP/1.1\rHost: web\r\r", "GET", "400")},
		{
			name:    "chunk sizes with leading zeros, upper case and extensions",
			clients: one(post("/a", "Transfer-Encoding: chunked\r\n", "0005;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\n\r\n"), "POST", "200 /a"),
			backend: []string{`POST /a cl=-1 te=chunked body="hello0123456789"`},
		},
		{name: "chunk size overflowing", clients: one(post("/a", "Transfer-Encoding: chunked\r\n", "10000000000000005\r\nhello\r\n0\r\n\r\n"), "POST", "400")},
		{name: "negative chunk size", clients: one(post("/a", "Transfer-Encoding: chunked\r\n", "-5\r\nhello\r\n0\r\n\r\n"), "POST", "400")},
		{name: "chunk longer than its size", clients: one(post("/a", "Transfer-Encoding: chunked\r\n", "3\r\nhello\r\n0\r\n\r\n"), "POST", "400")},
		{name: "chunked body cut short", clients: one(post("/a", "Transfer-Encoding: chunked\r\n", "5\r\nhel"), "POST", "400")},
		{
			name:    "trailers pass, identity trailers do not",
			clients: one(post("/a", "Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\nX-T: v\r\nX-Causeway-Source-Principal: spiffe://evil\r\n\r\n"), "POST", "200 /a"),
			backend: []string{`POST /a cl=-1 te=chunked body="hello" trailer=map[X-T:[v]]`},
			notRaw:  []string{"evil"},
		},
		{
			name: "pipelined requests are answered in order",
			clients: []framingClient{{send: []string{get("/1") + post("/2", "Content-Length: 2\r\n", "hi") + "HEAD /3 HTTP/1.1\r\nHost: web\r\n\r\n" + get("/4")},
				methods: []string{"GET", "POST", "HEAD", "GET"}, want: []string{"200 /1", "200 /2", "200 ", "200 /4"}}},
			backend: []string{`GET /1 cl=0 te= body=""`, `POST /2 cl=2 te= body="hi"`, `HEAD /3 cl=0 te= body=""`, `GET /4 cl=0 te= body=""`},
		},
		{
			name:    "a request smuggled in a body stays a body",
			clients: one(post("/a", "Content-Length: 35\r\n", "GET /smuggled HTTP/1.1\r\nHost: w\r\n\r\n"), "POST", "200 /a"),
			backend: []string{`POST /a cl=35 te= body="GET /smuggled HTTP/1.1\r\nHost: w\r\n\r\n"`},
		},
		{
			name:    "one 100 Continue",
			clients: one(post("/a", "Content-Length: 5\r\nExpect: 100-continue\r\n", "hello"), "POST", "100", "200 /a"),
			backend: []string{`POST /a cl=5 te= body="hello"`},
		},
		{
			name: "an upstream's unasked 100 Continue is not passed on",
			clients: []framingClient{{send: []string{post("/a", "Content-Length: 5\r\nExpect: 100-continue\r\n", "hello") + get("/b")},
				methods: []string{"POST", "GET"}, want: []string{"100", "200 /a", "200 /b"}}},
			respond: func(_ int, req *http.Request) (string, string) {
				return "HTTP/1.1 100 Continue\r\n\r\n" + okAnswer(req), ""
			},
			backend: []string{`POST /a cl=5 te= body="hello"`, `GET /b cl=0 te= body=""`},
		},
		{
			name:    "HEAD and bodyless answers pass framed",
			clients: []framingClient{{send: []string{"HEAD /h HTTP/1.1\r\nHost: web\r\n\r\n" + get("/204") + get("/after")}, methods: []string{"HEAD", "GET", "GET"}, want: []string{"200 ", "204", "200 /after"}}},
			respond: func(_ int, req *http.Request) (string, string) {
				if req.RequestURI == "/204" {
					return "HTTP/1.1 204 No Content\r\n\r\n", ""
				}
				return okAnswer(req), ""
			},
			backend: []string{`HEAD /h cl=0 te= body=""`, `GET /204 cl=0 te= body=""`, `GET /after cl=0 te= body=""`},
		},
	}
	// A backend that sends more than the answer, with it or a moment later
	// while the connection idles in the waypoint's pool: the next client's
	// request must get its own answer, never those bytes.
	for _, m := range []struct{ name, method, answer, extra string }{
		{"an extra response", "GET", "", "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nSTALE!"},
		{"a body after a HEAD answer", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n", "STALE!"},
		{"bytes after a 204", "GET", "HTTP/1.1 204 No Content\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nSTALE!"},
		{"a body after a 304", "GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 6\r\n\r\n", "STALE!"},
	} {
		want := map[string]string{"GET": "200 /1", "HEAD": "200 "}[m.method]
		if strings.Contains(m.answer, " 204 ") || strings.Contains(m.answer, " 304 ") {
			want = m.answer[9:12]
		}
		for _, later := range []bool{false, true} {
			when := " with the answer"
			if later {
				when = " while idle"
			}
			cases = append(cases, framingCase{
				name: m.name + when,
				clients: []framingClient{
					{send: []string{m.method + " /1 HTTP/1.1\r\nHost: web\r\n\r\n"}, methods: []string{m.method}, want: []string{want}},
					{send: []string{get("/2")}, methods: []string{"GET"}, want: []string{"200 /2"}},
				},
				respond: func(_ int, req *http.Request) (string, string) {
					if req.RequestURI != "/1" {
						return okAnswer(req), ""
					}
					answer := cmp.Or(m.answer, okAnswer(req))
					if later {
						return answer, m.extra
					}
					return answer + m.extra, ""
				},
				later:   later,
				backend: []string{m.method + ` /1 cl=0 te= body=""`, `GET /2 cl=0 te= body=""`},
			})
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := startRecordingBackend(t)
			if c.respond != nil {
				b.respond = c.respond
			}
			h := newHarness(t)
			h.addService("web", "http", b.addr)
			h.update(nil, nil)
			front := h.front(webInfo(trust.Unauthenticated()))
			for i, cl := range c.clients {
				if i > 0 && c.later {
					<-b.wrote // the previous exchange's late bytes were sent
				}
				conn := dialFront(t, front)
				for _, s := range cl.send {
					if _, err := io.WriteString(conn, s); err != nil {
						break // refused and closed before the rest
					}
				}
				conn.(*net.TCPConn).CloseWrite() // a half-close: the answers still come
				br := bufio.NewReader(conn)
				got, err := readResponses(br, cl.methods)
				if !slices.Equal(got, cl.want) {
					t.Fatalf("client %d got %q (%v), want %q", i, got, err, cl.want)
				}
				if rest, _ := io.ReadAll(br); len(rest) > 0 {
					t.Fatalf("client %d got more: %q", i, rest)
				}
				conn.Close()
			}
			reqs, raw := b.received()
			if !slices.Equal(reqs, c.backend) {
				t.Errorf("the backend received:\n%s\nwant:\n%s\nbytes: %q", strings.Join(reqs, "\n"), strings.Join(c.backend, "\n"), raw)
			}
			for _, s := range c.notRaw {
				if strings.Contains(raw, s) {
					t.Errorf("the backend's bytes have %q: %q", s, raw)
				}
			}
		})
	}
}
