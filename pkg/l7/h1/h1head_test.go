package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"testing"
)

// Heads the fast path must take: if it declined them, the fuzz test below
// would hold nothing.
var plainRequests = []string{
	"GET /bench/item HTTP/1.1\r\nHost: backend.bench\r\nUser-Agent: causeway-bench/1\r\nAccept: */*\r\n\r\n",
	"GET /a/b?x=1&y=%20 HTTP/1.1\r\nhost: a:80\r\nx-lower: 1\r\nX-Multi: 1\r\nX-Multi:2\r\nX-Empty:\r\nX-Pad: \t v \t\r\n\r\n",
	"DELETE /%41%2F HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
	"GET / HTTP/1.0\r\n\r\n",
	"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\nGET /next HTTP/1.1\r\n",
	"OPTIONS /x HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\n\r\n",
	"GET / HTTP/1.1\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: \r\n\r\n",
}

var plainResponses = []string{
	"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nX: 1\r\nx: 2\r\n\r\n",
	"HTTP/1.1 200\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
	"HTTP/1.1   503 Service Unavailable\r\nContent-Length:  2 \r\n\r\nno",
	"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
}

// Heads it must leave to net/http (some net/http refuses, some it accepts).
var unplainHeads = []string{
	"GET / HTTP/1.1\r\nHost: a\r\n",                                 // not whole
	"GET / HTTP/1.1\nHost: a\n\n",                                   // bare LF
	"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n folded\r\n\r\n",          // obs-fold
	"GET / HTTP/1.1\r\nX : y\r\n\r\n",                               // space before colon
	"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",                  // two hosts
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi",     // request body
	"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", // chunked
	"GET / HTTP/1.1\r\nPragma: no-cache\r\n\r\n",                    // rewritten by net/http
	"GET / HTTP/1.1\r\nTrailer: X\r\n\r\n",
	"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
	"GET http://a/ HTTP/1.1\r\nHost: b\r\n\r\n",
	"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
	"GET /%zz HTTP/1.1\r\nHost: a\r\n\r\n",
	"HTTP/1.1 100 Continue\r\n\r\n",
	"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\n\r\nunbounded",
	"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
	"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200\tOK\r\nContent-Length: 1\r\n\r\na",
	"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n",
}

func TestPlainHeadTakesCommonHeads(t *testing.T) {
	for _, s := range plainRequests {
		if plainRequest([]byte(s), new(http.Request)) == 0 {
			t.Errorf("plainRequest declined %q", s)
		}
	}
	for _, s := range plainResponses {
		if resp, _ := plainResponse([]byte(s), nil, &http.Request{Method: http.MethodGet}); resp == nil {
			t.Errorf("plainResponse declined %q", s)
		}
	}
	for _, s := range unplainHeads {
		if plainRequest([]byte(s), new(http.Request)) != 0 {
			t.Errorf("plainRequest took %q", s)
		}
		if resp, _ := plainResponse([]byte(s), nil, &http.Request{Method: http.MethodGet}); resp != nil {
			t.Errorf("plainResponse took %q", s)
		}
	}
	if resp, _ := plainResponse([]byte(plainResponses[0]), nil, &http.Request{Method: http.MethodHead}); resp != nil {
		t.Error("plainResponse took the response to a HEAD request")
	}
}

// FuzzPlainHead checks that whatever head the fast paths take, net/http
// parses to the same request or response (and body), with the same length.
func FuzzPlainHead(f *testing.F) {
	for _, s := range slices.Concat(plainRequests, plainResponses, unplainHeads) {
		f.Add([]byte(s), false)
	}
	f.Add([]byte(plainResponses[0]), true)
	f.Fuzz(func(t *testing.T, data []byte, head bool) {
		got := new(http.Request)
		if n := plainRequest(data, got); n != 0 {
			br := bufio.NewReaderSize(bytes.NewReader(data), len(data)+16)
			want, err := http.ReadRequest(br)
			if err != nil {
				t.Fatalf("plainRequest took %q; http.ReadRequest: %v", data, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("requests differ for %q:\nplain    %+v\nnet/http %+v", data, got, want)
			}
			if read := len(data) - br.Buffered(); read != n {
				t.Fatalf("plainRequest's head of %q is %d bytes, http.ReadRequest read %d", data, n, read)
			}
		}
		req := &http.Request{Method: http.MethodGet}
		if head {
			req.Method = http.MethodHead
		}
		br := bufio.NewReaderSize(bytes.NewReader(data), len(data)+16)
		_, _ = br.Peek(len(data))
		resp, n := plainResponse(buffered(br), br, req)
		if resp == nil {
			return
		}
		_, _ = br.Discard(n)
		want, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(data)), req)
		if err != nil {
			t.Fatalf("plainResponse took %q; http.ReadResponse: %v", data, err)
		}
		gotBody, gotErr := io.ReadAll(resp.Body)
		wantBody, wantErr := io.ReadAll(want.Body)
		if !bytes.Equal(gotBody, wantBody) || gotErr != wantErr {
			t.Fatalf("bodies of %q differ: plain %q (%v), net/http %q (%v)", data, gotBody, gotErr, wantBody, wantErr)
		}
		resp.Body, want.Body = nil, nil
		if !reflect.DeepEqual(resp, want) {
			t.Fatalf("responses differ for %q:\nplain    %+v\nnet/http %+v", data, resp, want)
		}
	})
}

// BenchmarkHead compares the fast paths with net/http on the benchmark's
// request (bench/waypoint) and a typical response to it.
func BenchmarkHead(b *testing.B) {
	reqHead := []byte(plainRequests[0])
	respHead := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nDate: Mon, 30 Nov 2026 04:00:00 GMT\r\nContent-Length: 5\r\n\r\nhello")
	get := &http.Request{Method: http.MethodGet}
	b.Run("request/plain", func(b *testing.B) {
		benchParse(b, reqHead, func(br *bufio.Reader) bool { return plainRequest(peekAll(br), new(http.Request)) != 0 })
	})
	b.Run("request/net-http", func(b *testing.B) {
		benchParse(b, reqHead, func(br *bufio.Reader) bool { _, err := http.ReadRequest(br); return err == nil })
	})
	b.Run("response/plain", func(b *testing.B) {
		benchParse(b, respHead, func(br *bufio.Reader) bool { resp, _ := plainResponse(peekAll(br), br, get); return resp != nil })
	})
	b.Run("response/net-http", func(b *testing.B) {
		benchParse(b, respHead, func(br *bufio.Reader) bool { _, err := http.ReadResponse(br, get); return err == nil })
	})
}

// peekAll fills br's buffer and returns it, as the server's first Peek does.
func peekAll(br *bufio.Reader) []byte {
	_, _ = br.Peek(1)
	return buffered(br)
}

// benchParse runs parse on head, from a reader reset to it each time.
func benchParse(b *testing.B, head []byte, parse func(*bufio.Reader) bool) {
	b.ReportAllocs()
	r := bytes.NewReader(head)
	br := bufio.NewReader(r)
	for b.Loop() {
		r.Reset(head)
		br.Reset(r)
		if !parse(br) {
			b.Fatalf("%q not parsed", head)
		}
	}
}

// Responses whose fields rawResponse passes on as they are.
var rawResponses = []string{
	"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Mon, 30 Nov 2026 05:00:00 GMT\r\n\r\nhello, world\n",
	"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 30 Nov 2026 05:00:00 GMT\r\nContent-Type: text/html\r\nContent-Length: 2\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nETag: \"x\"\r\n\r\nok",
	"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
	"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-lower: 1\r\ndate: Mon, 30 Nov 2026 05:00:00 GMT\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 7\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\ndata: x",
}

// Plain responses whose fields are not in raw form.
var unrawResponses = []string{
	"HTTP/1.1 200 OK\r\nContent-Length:  0 \r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length:0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: X-Private\r\nX-Private: 1\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nProxy-Authenticate: Basic\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nUpgrade: h2c\r\n\r\n",
}

func TestRawResponseTakesCommonHeads(t *testing.T) {
	get := &http.Request{Method: http.MethodGet}
	for _, s := range rawResponses {
		var raw RawFields
		if resp, _ := rawResponse([]byte(s), nil, get, &raw); resp == nil || !raw.OK {
			t.Errorf("rawResponse declined %q", s)
		}
	}
	for _, s := range slices.Concat(unrawResponses, unplainHeads) {
		if resp, _ := rawResponse([]byte(s), nil, get, new(RawFields)); resp != nil {
			t.Errorf("rawResponse took %q", s)
		}
	}
	for _, s := range unrawResponses {
		if resp, _ := plainResponse([]byte(s), nil, get); resp == nil {
			t.Errorf("plainResponse declined %q: the case belongs elsewhere", s)
		}
	}
	if resp, _ := rawResponse([]byte(rawResponses[0]), nil, &http.Request{Method: http.MethodHead}, new(RawFields)); resp != nil {
		t.Error("rawResponse took the response to a HEAD request")
	}
}

// FuzzWriteRaw holds the raw path to the map path: for any response head
// rawResponse takes, plainResponse takes it too, and what the server
// writes for it to the client — ResponseWriter.WriteRaw with the fields as
// they came, or WriteHeader with forward's header map — parses to the same
// response (fields in another order) and ends or keeps the connection
// alike, for HTTP/1.0 and 1.1 clients asking to close or keep it.
func FuzzWriteRaw(f *testing.F) {
	for _, s := range slices.Concat(rawResponses, unrawResponses, plainResponses) {
		f.Add([]byte(s), uint8(0))
	}
	f.Add([]byte(rawResponses[1]), uint8(3))
	f.Add([]byte(rawResponses[2]), uint8(4))
	f.Fuzz(func(t *testing.T, data []byte, client uint8) {
		minor := int(client & 1)
		h := http.Header{}
		switch client >> 1 & 3 {
		case 1:
			h.Set("Connection", "close")
		case 2:
			h.Set("Connection", "keep-alive")
		}
		req := &http.Request{Method: http.MethodGet, Proto: "HTTP/1." + strconv.Itoa(minor), ProtoMajor: 1, ProtoMinor: minor,
			Header: h, Close: closes(minor, h)}
		reader := func() *bufio.Reader {
			br := bufio.NewReaderSize(bytes.NewReader(data), len(data)+16)
			_, _ = br.Peek(len(data))
			return br
		}
		var raw RawFields
		rbr := reader()
		resp, n := rawResponse(buffered(rbr), rbr, req, &raw)
		if resp == nil {
			return
		}
		_, _ = rbr.Discard(n)
		pbr := reader()
		plain, pn := plainResponse(buffered(pbr), pbr, req)
		if plain == nil || pn != n {
			t.Fatalf("rawResponse took %q (%d bytes), plainResponse did not (%d)", data, n, pn)
		}
		_, _ = pbr.Discard(pn)
		RemoveHopByHop(plain.Header) // as forward does
		if got := raw.Header(); !reflect.DeepEqual(got, plain.Header) {
			t.Fatalf("fields of %q: raw %v, plain %v", data, got, plain.Header)
		}
		if resp.Close != plain.Close || resp.StatusCode != plain.StatusCode || resp.ContentLength != plain.ContentLength {
			t.Fatalf("responses to %q differ: raw %+v, plain %+v", data, resp, plain)
		}

		var rawOut, mapOut bytes.Buffer
		rc := &h1Conn{bw: bufio.NewWriter(&rawOut)}
		rw := rc.newResponse(req)
		if !rw.CanWriteRaw() || !rw.WriteRaw(resp.StatusCode, resp.ContentLength, &raw) {
			t.Fatal("a fresh response could not be written raw")
		}
		rawErr := copyAll(rw, resp.Body)
		rc.bw.Flush()
		mc := &h1Conn{bw: bufio.NewWriter(&mapOut)}
		mw := mc.newResponse(req)
		mw.TakeHeader(plain.Header)
		mw.WriteHeader(plain.StatusCode)
		mapErr := copyAll(mw, plain.Body)
		mc.bw.Flush()
		if (rawErr == nil) != (mapErr == nil) || rw.closeAfter != mw.closeAfter {
			t.Fatalf("for %q (client %d): raw body %v, close %v; map body %v, close %v", data, client, rawErr, rw.closeAfter, mapErr, mw.closeAfter)
		}

		got, err1 := http.ReadResponse(bufio.NewReader(&rawOut), req)
		want, err2 := http.ReadResponse(bufio.NewReader(&mapOut), req)
		if err1 != nil || err2 != nil {
			t.Fatalf("reading what was written for %q: raw %v, map %v", data, err1, err2)
		}
		gotBody, _ := io.ReadAll(got.Body)
		wantBody, _ := io.ReadAll(want.Body)
		if !raw.date { // each wrote its own
			got.Header.Del("Date")
			want.Header.Del("Date")
		}
		got.Body, want.Body = nil, nil
		if !bytes.Equal(gotBody, wantBody) || !reflect.DeepEqual(got, want) {
			t.Fatalf("written for %q (client %d):\nraw %+v %q\nmap %+v %q", data, client, got, gotBody, want, wantBody)
		}
	})
}

// copyAll copies body to w as copyBody does, returning the first error.
func copyAll(w io.Writer, body io.Reader) error {
	_, err := io.Copy(w, body)
	return err
}
