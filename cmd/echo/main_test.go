package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
)

func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, []net.Listener{ln}, identity{Pod: "echo-1", Namespace: "shop"}, time.Minute)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

func decode(t *testing.T, resp *http.Response) Echo {
	t.Helper()
	defer resp.Body.Close()
	var e Echo
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestHTTP1AndH2C(t *testing.T) {
	addr := startEcho(t)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/items?id=7", strings.NewReader("hello"))
	req.Header.Set("X-Test", "one")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	e := decode(t, resp)
	if e.Protocol != "HTTP/1.1" || e.Method != "POST" || e.Path != "/items?id=7" || e.Body != "hello" ||
		e.Headers["X-Test"][0] != "one" || e.Pod != "echo-1" || e.Namespace != "shop" {
		t.Fatalf("unexpected echo %+v", e)
	}

	h2 := &http.Client{Transport: &http2.Transport{AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, n, a string, _ *tls.Config) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, a)
		}}}
	resp, err = h2.Get("http://" + addr + "/status/503")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 503 {
		t.Fatalf("status = %d, want 503", resp.StatusCode)
	}
	if e := decode(t, resp); e.Protocol != "HTTP/2.0" {
		t.Fatalf("protocol = %q, want HTTP/2.0", e.Protocol)
	}
}

func TestGRPC(t *testing.T) {
	addr := startEcho(t)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "ann")
	out := new(wrapperspb.StringValue)
	if err := cc.Invoke(ctx, "/shop.Ratings/Get", wrapperspb.String("book-1"), out); err != nil {
		t.Fatal(err)
	}
	var e Echo
	if err := json.Unmarshal([]byte(out.GetValue()), &e); err != nil {
		t.Fatal(err)
	}
	if e.Protocol != "gRPC" || e.Path != "/shop.Ratings/Get" || e.Body != "book-1" || e.Headers["x-user"][0] != "ann" {
		t.Fatalf("unexpected echo %+v", e)
	}
}

func TestFetchPrintsAnswers(t *testing.T) {
	addr := startEcho(t)
	var out, errs strings.Builder
	code := fetchMain([]string{"-timeout", "3s", "-H", "Traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "http://" + addr + "/a", "http://" + addr + "/b"}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errs.String())
	}
	dec := json.NewDecoder(strings.NewReader(out.String()))
	for _, want := range []string{"/a", "/b"} {
		var e Echo
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("answer for %s: %v (stdout %q)", want, err, out.String())
		}
		if e.Path != want || e.Pod != "echo-1" || e.Method != http.MethodGet {
			t.Fatalf("answer %+v, want GET %s from echo-1", e, want)
		}
		if tp := e.Headers["Traceparent"]; len(tp) != 1 || tp[0] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
			t.Fatalf("answer for %s: traceparent %q, want the -H header's", want, tp)
		}
	}
}

func TestFetchFailsOnErrorStatusAndBadInput(t *testing.T) {
	addr := startEcho(t)
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"http://" + addr + "/status/503"}, 1, "status 503"},
		{[]string{"http://" + addr + "/ok", "http://" + addr + "/status/404"}, 1, "status 404"},
		{[]string{"-timeout", "1s", "http://127.0.0.1:1/"}, 1, "connection refused"},
		{nil, 2, "usage"},
		{[]string{"-timeout", "soon", "http://" + addr}, 2, "invalid value"},
		{[]string{"-H", "no colon", "http://" + addr}, 2, `want "Name: value"`},
	} {
		var out, errs strings.Builder
		if code := fetchMain(tc.args, &out, &errs); code != tc.code || !strings.Contains(errs.String(), tc.err) {
			t.Errorf("fetch %q: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errs.String(), tc.code, tc.err)
		}
	}
}

// hold answers on one connection until it ends: closed under it, hold
// exits 1 saying so (it never dials again); held for its time, 0.
func TestHoldEndsWithItsConnection(t *testing.T) {
	addr := startEcho(t)
	var out, errs strings.Builder
	if code := holdMain([]string{"-interval", "10ms", "-for", "200ms", "http://" + addr + "/h"}, &out, &errs); code != 0 || !strings.Contains(out.String(), "answer 3: 200 OK") {
		t.Fatalf("held for its time: exit %d, stdout %q, stderr %q", code, out.String(), errs.String())
	}

	// A server that answers twice on each connection, then closes it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dials := make(chan struct{}, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dials <- struct{}{}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for range 2 {
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
				}
			}()
		}
	}()
	out.Reset()
	errs.Reset()
	code := holdMain([]string{"-interval", "10ms", "-for", "10s", "http://" + ln.Addr().String() + "/h"}, &out, &errs)
	if code != 1 || !strings.Contains(errs.String(), "connection ended after 2 answers") || len(dials) != 1 {
		t.Fatalf("connection closed: exit %d, stdout %q, stderr %q, %d dials; want exit 1 after 2 answers on 1 connection", code, out.String(), errs.String(), len(dials))
	}
	if code := holdMain(nil, &out, &errs); code != 2 {
		t.Fatalf("no URL: exit %d", code)
	}
}

// load counts every request and every failure, for its time or until its
// standard input ends.
func TestLoadCountsFailures(t *testing.T) {
	addr := startEcho(t)
	run := func(stdin io.Reader, args ...string) (int, LoadSummary, string) {
		t.Helper()
		var out, errs strings.Builder
		code := loadMain(args, stdin, &out, &errs)
		var sum LoadSummary
		if code != 2 {
			if err := json.Unmarshal([]byte(out.String()), &sum); err != nil {
				t.Fatalf("load %q: summary %q: %v", args, out.String(), err)
			}
		}
		return code, sum, errs.String()
	}
	if code, sum, errs := run(nil, "-c", "2", "-interval", "5ms", "-for", "200ms", "http://"+addr+"/ok"); code != 0 || sum.Sent < 2 || sum.Failed != 0 || !sum.Last.After(sum.First) ||
		sum.FirstAnswer.Before(sum.First) || sum.FirstAnswer.After(sum.Last) || strings.Count(errs, loadAnswered) != 1 {
		t.Fatalf("to a server that answers: exit %d, %+v, stderr %q", code, sum, errs)
	}
	code, sum, errs := run(nil, "-interval", "5ms", "-for", "100ms", "http://"+addr+"/status/503")
	if code != 1 || sum.Sent == 0 || sum.Failed != sum.Sent || !sum.FirstAnswer.IsZero() || !strings.Contains(sum.Errors[0], "status 503") || !strings.Contains(errs, "status 503") ||
		strings.Contains(errs, loadAnswered) {
		t.Fatalf("to a server that answers 503: exit %d, %+v, stderr %q", code, sum, errs)
	}
	if len(sum.Errors) > maxLoadErrors {
		t.Fatalf("%d errors kept, want at most %d", len(sum.Errors), maxLoadErrors)
	}
	// Until standard input ends.
	r, w := io.Pipe()
	time.AfterFunc(100*time.Millisecond, func() { w.Close() })
	if code, sum, errs := run(r, "-interval", "5ms", "http://"+addr+"/ok"); code != 0 || sum.Sent == 0 {
		t.Fatalf("until stdin ends: exit %d, %+v, stderr %q", code, sum, errs)
	}
	for _, args := range [][]string{nil, {"-c", "0", "http://" + addr}, {"ftp://" + addr}, {"-for", "soon", "http://" + addr}} {
		if code, _, _ := run(nil, args...); code != 2 {
			t.Errorf("load %q: exit %d, want 2", args, code)
		}
	}
}

// Over TLS the answer names the server name the client sent.
func TestTLSServerName(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := backendtlstest.NewCA("echo test CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Leaf([]string{"backend.example"}, nil, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, []net.Listener{tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}})}, identity{Pod: "echo-1"}, time.Minute)
	}()
	t.Cleanup(func() { cancel(); <-done })
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "backend.example"}}}
	resp, err := c.Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	if e := decode(t, resp); e.TLSServerName != "backend.example" {
		t.Fatalf("tls_server_name %q, want backend.example", e.TLSServerName)
	}
	resp, err = http.Get("http://" + startEcho(t) + "/")
	if err != nil {
		t.Fatal(err)
	}
	if e := decode(t, resp); e.TLSServerName != "" {
		t.Fatalf("plaintext answer names server name %q", e.TLSServerName)
	}
}

// load -each prints every request's outcome, the identity the destination
// was told included, before the summary.
func TestLoadEach(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%2 == 0 {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		_ = json.NewEncoder(w).Encode(Echo{Pod: "dest-1", Headers: map[string][]string{principalHeader: {"spiffe://td/ns/a/sa/b"}}})
	}))
	defer srv.Close()
	var out, errs strings.Builder
	code := loadMain([]string{"-each", "-interval", "5ms", "-for", "100ms", srv.URL + "/x"}, nil, &out, &errs)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if code != 1 || len(lines) < 3 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and a line per request", code, out.String(), errs.String())
	}
	var sum LoadSummary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil || sum.Sent != int64(len(lines)-1) {
		t.Fatalf("summary %q (%v), want %d requests", lines[len(lines)-1], err, len(lines)-1)
	}
	for i, l := range lines[:len(lines)-1] {
		var o Outcome
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatalf("line %d %q: %v", i, l, err)
		}
		ok := o.Status == 200 && o.Pod == "dest-1" && o.Principal == "spiffe://td/ns/a/sa/b" && o.Error == ""
		denied := o.Status == 403 && o.Pod == "" && o.Principal == "" && strings.Contains(o.Error, "status 403")
		if !(ok || denied) || o.Ended.Before(o.Began) {
			t.Errorf("line %d: %+v, want an answer from dest-1 told its principal, or a 403", i, o)
		}
	}
}
