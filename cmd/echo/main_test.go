package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, []net.Listener{ln}, identity{Pod: "echo-1", Namespace: "shop"}) }()
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
