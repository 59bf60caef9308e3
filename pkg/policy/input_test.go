package policy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/input")

const (
	frontendID = "spiffe://cluster.local/ns/shop/sa/frontend"
	checkoutID = "spiffe://cluster.local/ns/shop/sa/checkout"
)

// fixedTime has every fractional digit set, to pin protobuf's 9-digit form.
var fixedTime = time.Date(2026, 11, 29, 10, 20, 30, 123456789, time.UTC)

// readRequest parses raw HTTP/1.x bytes as a server would.
func readRequest(t testing.TB, raw string) *http.Request {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(strings.ReplaceAll(raw, "\n", "\r\n"))))
	if err != nil {
		t.Fatalf("read request: %v", err)
	}
	return r
}

type peers struct {
	frontend trust.Peer
	tlsOnly  trust.Peer
	checkout trust.Identity
}

func newPeers(t testing.TB) peers {
	t.Helper()
	ca := trusttest.NewCA(t, "cluster.local")
	return peers{
		frontend: ca.Peer(t, ca.Certificate(t, trusttest.Identity(t, frontendID), 0)),
		tlsOnly:  ca.Peer(t, nil),
		checkout: trusttest.Identity(t, checkoutID),
	}
}

func goldenCases(t *testing.T, p peers) map[string]struct {
	req  *Request
	opts InputOptions
} {
	get := readRequest(t, `GET /api/v1/products/caf%C3%A9?id=1&id=2&q=a+b HTTP/1.1
Host: checkout.shop.svc:8080
Accept: */*
Accept: text/plain
Cookie: a=1
Cookie: b=2
X-Forwarded-Client-Cert: URI=spiffe://cluster.local/ns/shop/sa/admin
X-Envoy-Auth-Partial-Body: false
Authorization: Bearer abc
Forwarded: for="127.0.0.1:4000"

`)
	postJSON := readRequest(t, `POST /people HTTP/1.1
Host: 127.0.20.1:8080
Content-Type: application/json; charset=utf-8
Content-Length: 42
X-Forwarded-Client-Cert: URI=`+frontendID+`
Forwarded: for="127.0.0.1:4000";by="`+frontendID+`"

{"firstname":"Ada","roles":["a",1,true]}  `)
	form := &http.Request{
		Method:        "PUT",
		Host:          "checkout",
		RequestURI:    "/form",
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		ContentLength: -1,
		Header: http.Header{
			"Content-Type": {"application/x-www-form-urlencoded"},
			"Te":           {"trailers"},
		},
	}
	truncated := readRequest(t, `POST /upload HTTP/1.1
Host: checkout
Content-Type: application/json
Transfer-Encoding: chunked

5
{"a":
0

`)
	multipartBody := "--XyZ\r\n" +
		"Content-Disposition: form-data; name=\"title\"\r\n\r\nreport\r\n" +
		"--XyZ\r\n" +
		"Content-Disposition: form-data; name=\"meta\"\r\nContent-Type: application/json\r\n\r\n{\"pages\":3,\"tags\":[\"q1\"]}\r\n" +
		"--XyZ\r\n" +
		"Content-Disposition: form-data; name=\"title\"\r\n\r\nsecond\r\n" +
		"--XyZ\r\n" +
		"Content-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\n" +
		"--XyZ\r\n" +
		"Content-Disposition: attachment\r\n\r\nno form name: skipped\r\n" +
		"--XyZ--\r\n"
	multipartReq := readRequest(t, "POST /upload HTTP/1.1\nHost: checkout\nContent-Type: multipart/form-data; boundary=XyZ\n"+
		"Content-Length: "+strconv.Itoa(len(multipartBody))+"\n\n"+multipartBody)
	src := netip.MustParseAddrPort("127.0.10.11:45678")
	dst := netip.MustParseAddrPort("127.0.20.1:8080")
	return map[string]struct {
		req  *Request
		opts InputOptions
	}{
		"authenticated_get": {req: &Request{HTTP: get, Source: p.frontend, SourceAddr: src, DestAddr: dst,
			Destination: p.checkout, ID: "12345", Time: fixedTime}},
		"tls_only_post_json": {req: &Request{HTTP: postJSON, Body: []byte(`{"firstname":"Ada","roles":["a",1,true]}  `),
			Source: p.tlsOnly, SourceAddr: src, DestAddr: dst, Destination: p.checkout, Time: fixedTime},
			opts: InputOptions{ParseBody: true}},
		"h2_form": {req: &Request{HTTP: form, Body: []byte("a=1&a=2&b=%20x"), Source: p.frontend,
			SourceAddr: netip.MustParseAddrPort("[::ffff:127.0.10.11]:1"), DestAddr: netip.AddrPortFrom(netip.MustParseAddr("127.0.20.1"), 0),
			Time: fixedTime.Truncate(time.Millisecond)}, opts: InputOptions{ParseBody: true}},
		"truncated_body": {req: &Request{HTTP: truncated, Body: []byte(`{"a":`), BodyTruncated: true,
			Source: p.tlsOnly, Time: fixedTime.Truncate(time.Second)}, opts: InputOptions{ParseBody: true}},
		"multipart_form": {req: &Request{HTTP: multipartReq, Body: []byte(multipartBody), Source: p.frontend, Destination: p.checkout,
			Time: fixedTime}, opts: InputOptions{ParseBody: true}},
		"body_over_limit": {req: &Request{HTTP: postJSON, Body: []byte(`{"firstname":"Ada","roles":["a",1,true]}  `),
			Source: p.frontend, Destination: p.checkout, Time: fixedTime},
			opts: InputOptions{ParseBody: true, MaxBodyBytes: 10}},
	}
}

// TestInputGolden compares BuildInput's document with JSON files that show
// the OPA-Envoy v3 shape. Run with -update to rewrite them after a reviewed change.
func TestInputGolden(t *testing.T) {
	p := newPeers(t)
	for name, tc := range goldenCases(t, p) {
		t.Run(name, func(t *testing.T) {
			v, err := BuildInput(tc.req, tc.opts)
			if err != nil {
				t.Fatalf("BuildInput: %v", err)
			}
			got, err := ast.JSON(v)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			enc.SetIndent("", "  ")
			if err := enc.Encode(got); err != nil {
				t.Fatal(err)
			}
			gotJSON := buf.Bytes()
			file := filepath.Join("testdata", "input", name+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, gotJSON, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			wantJSON, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("golden file (run with -update to create): %v", err)
			}
			var want, gotAny any
			if err := json.Unmarshal(wantJSON, &want); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(gotJSON, &gotAny); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(want, gotAny) {
				t.Errorf("input differs from %s\n got: %s\nwant: %s", file, gotJSON, wantJSON)
			}
		})
	}
}

// TestInputPrincipals pins the trust rule directly: principals come from the
// authenticated peer only, and are absent (not empty) otherwise.
func TestInputPrincipals(t *testing.T) {
	p := newPeers(t)
	claim := readRequest(t, "GET / HTTP/1.1\nHost: x\nX-Forwarded-Client-Cert: URI="+frontendID+
		"\nForwarded: for=1.2.3.4;by="+frontendID+"\nBaggage: principal="+frontendID+"\n\n")
	v, err := BuildInput(&Request{HTTP: claim, Source: p.tlsOnly, Destination: p.checkout}, InputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj := v.(ast.Object)
	if obj.Get(ast.StringTerm("source_principal")) != nil {
		t.Error("source_principal present for an unauthenticated peer")
	}
	if got := find(v, "attributes", "source", "principal"); got != nil {
		t.Errorf("attributes.source.principal = %v for an unauthenticated peer", got)
	}
	if got := obj.Get(ast.StringTerm("destination_principal")); got == nil || got.Value.Compare(ast.String(checkoutID)) != 0 {
		t.Errorf("destination_principal = %v, want %s", got, checkoutID)
	}
	if got := find(v, "attributes", "request", "http", "headers", "x-forwarded-client-cert"); got != nil {
		t.Errorf("client x-forwarded-client-cert reached the input: %v", got)
	}

	v, err = BuildInput(&Request{HTTP: claim, Source: p.frontend}, InputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := find(v, "attributes", "source", "principal"); got == nil || got.Compare(ast.String(frontendID)) != 0 {
		t.Errorf("attributes.source.principal = %v, want %s", got, frontendID)
	}
	if v.(ast.Object).Get(ast.StringTerm("destination_principal")) != nil {
		t.Error("destination_principal present without a destination identity")
	}

	// Input parts are cached by address: an unauthenticated tunnel from the
	// address an authenticated one just used still gets no principal.
	addr := netip.MustParseAddrPort("127.0.10.99:40000")
	for i, peer := range []trust.Peer{p.frontend, p.tlsOnly, p.frontend, p.tlsOnly} {
		v, err := BuildInput(&Request{HTTP: claim, Source: peer, SourceAddr: addr}, InputOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := find(v, "attributes", "source", "principal")
		if _, authenticated := peer.Identity(); authenticated != (got != nil) {
			t.Fatalf("request %d from %s: attributes.source.principal = %v", i, peer, got)
		}
		if a := find(v, "attributes", "source", "address", "socketAddress", "portValue"); a == nil || a.Compare(ast.InternedTerm(40000).Value) != 0 {
			t.Fatalf("request %d: port = %v", i, a)
		}
	}
}

// find returns the value at path in v, or nil.
func find(v ast.Value, path ...string) ast.Value {
	ref := make(ast.Ref, len(path))
	for i, p := range path {
		ref[i] = ast.StringTerm(p)
	}
	got, err := v.Find(ref)
	if err != nil {
		return nil
	}
	return got
}

func TestInputBadRequest(t *testing.T) {
	cases := map[string]struct {
		raw  string
		body string
		what string
	}{
		"bad query":       {raw: "GET /a?b=%zz HTTP/1.1\nHost: x\n\n", what: "query"},
		"semicolon query": {raw: "GET /a?b=1;c=2 HTTP/1.1\nHost: x\n\n", what: "query"},
		"invalid json": {raw: "POST /a HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: 9\n\n{\"a\": 1,]",
			body: `{"a": 1,]`, what: "body"},
		"json trailing data": {raw: "POST /a HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: 4\n\n{}{}",
			body: `{}{}`, what: "body"},
		"bad form": {raw: "POST /a HTTP/1.1\nHost: x\nContent-Type: application/x-www-form-urlencoded\nContent-Length: 4\n\na=%z",
			body: "a=%z", what: "body"},
		"multipart json part": {raw: "POST /a HTTP/1.1\nHost: x\nContent-Type: multipart/form-data; boundary=b\n\n",
			body: "--b\r\nContent-Disposition: form-data; name=\"j\"\r\nContent-Type: application/json\r\n\r\n{]\r\n--b--\r\n", what: "body"},
		"multipart cut short": {raw: "POST /a HTTP/1.1\nHost: x\nContent-Type: multipart/form-data; boundary=b\n\n",
			body: "--b\r\nContent-Disposition: form-data; name=\"j\"\r\n\r\nno closing boundary", what: "body"},
		"multipart bad content type": {raw: "POST /a HTTP/1.1\nHost: x\nContent-Type: multipart/form-data; boundary\n\n",
			body: "--b--\r\n", what: "body"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := readRequest(t, tc.raw)
			_, err := BuildInput(&Request{HTTP: r, Body: []byte(tc.body)}, InputOptions{ParseBody: true})
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("err = %v, want bad request", err)
			}
			var bre *BadRequestError
			if !errors.As(err, &bre) || bre.What != tc.what || bre.StatusCode() != http.StatusBadRequest {
				t.Fatalf("err = %#v, want a 400 about the %s", err, tc.what)
			}
		})
	}
	// net/http refuses such a path itself; the check still holds for any
	// request handed over.
	bad := &http.Request{Method: "GET", Host: "x", RequestURI: "/a%zz", Header: http.Header{}}
	if _, err := BuildInput(&Request{HTTP: bad}, InputOptions{}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("bad path escape: err = %v, want bad request", err)
	}
	// Without body parsing, an invalid body is not looked at.
	r := readRequest(t, cases["invalid json"].raw)
	if _, err := BuildInput(&Request{HTTP: r, Body: []byte(cases["invalid json"].body)}, InputOptions{}); err != nil {
		t.Fatalf("body parsing off: %v", err)
	}
	if _, err := BuildInput(&Request{}, InputOptions{}); err == nil || errors.Is(err, ErrBadRequest) {
		t.Fatalf("nil HTTP request: err = %v, want a non-400 error", err)
	}
}

func TestProtoTimestamp(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))
	for ns, want := range map[int]string{
		0:         "2026-01-02T02:04:05Z",
		120000000: "2026-01-02T02:04:05.120Z",
		123456000: "2026-01-02T02:04:05.123456Z",
		123456789: "2026-01-02T02:04:05.123456789Z",
	} {
		if got := protoTimestamp(base.Add(time.Duration(ns))); got != want {
			t.Errorf("protoTimestamp(+%dns) = %s, want %s", ns, got, want)
		}
	}
}

func TestSanitizeUTF8(t *testing.T) {
	if got := sanitizeUTF8([]byte("a\xffb\xc3\xa9")); got != "a!bé" {
		t.Errorf("sanitizeUTF8 = %q", got)
	}
	if !bytes.Equal([]byte(sanitizeUTF8([]byte("plain"))), []byte("plain")) {
		t.Error("valid input changed")
	}
}

func FuzzBuildInput(f *testing.F) {
	f.Add("/a/b%20c?x=1&y=%zz", "application/json", []byte(`{"a":[1,2]}`), "v")
	f.Add("/%", "application/x-www-form-urlencoded", []byte("a=1;b"), "\xff\x00\"")
	f.Add("/u", "multipart/form-data; boundary=b", []byte("--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\r\n--b--\r\n"), "")
	f.Fuzz(func(t *testing.T, target, contentType string, body []byte, header string) {
		r := &http.Request{Method: "POST", Host: "h", RequestURI: target, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {contentType}, "X-Custom": {header}, "Accept": {header, header}, "X-Request-Id": {header}},
			ContentLength: int64(len(body))}
		req := &Request{HTTP: r, Body: body}
		opts := InputOptions{ParseBody: true, MaxBodyBytes: 256}
		v, err := BuildInput(req, opts)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("non-400 error for a parse failure: %v", err)
			}
			return
		}
		if _, err := ast.JSON(v); err != nil {
			t.Fatalf("input is not JSON: %v", err)
		}
		d, err := newInputDoc(req, opts)
		if err != nil {
			t.Fatal(err)
		}
		checkDocAgrees(t, d)
	})
}

// Request targets are parsed once and their terms shared (pathTerms): the
// same target gives equal parts every time, a bad one the same 400, and a
// target too long to keep is still parsed.
func TestPathTermsCached(t *testing.T) {
	long := "/" + strings.Repeat("a/", maxCachedPath) + "end?x=1"
	for _, target := range []string{"/api/v1/orders/42?expand=items&expand=x", "/caf%C3%A9/", long} {
		first := pathTermsFor(target)
		again := pathTermsFor(target)
		if first.err != nil || again.err != nil {
			t.Fatalf("%.40s: %v / %v", target, first.err, again.err)
		}
		p, q, err := parsePathAndQuery(target)
		if err != nil || !again.parsedPath.Equal(p) || !again.parsedQuery.Equal(q) || string(again.path.Value.(ast.String)) != target {
			t.Fatalf("%.40s: cached %v %v, parsed %v %v", target, again.parsedPath, again.parsedQuery, p, q)
		}
	}
	if got := pathTermsFor("/caf%C3%A9/").parsedPath.String(); got != `["café", ""]` {
		t.Errorf("parsed_path = %s", got)
	}
	for range 2 {
		if err := pathTermsFor("/a?b=%zz").err; !errors.Is(err, ErrBadRequest) {
			t.Fatalf("bad query: %v, want a bad request every time", err)
		}
	}
}
