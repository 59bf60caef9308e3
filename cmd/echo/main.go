// Command echo is the mesh's test backend: on each address it listens on it
// answers HTTP/1.1, HTTP/2 cleartext and gRPC with a JSON description of what
// it received (in the style of the Gateway API conformance echo server), so
// people and tests can see what routing, filters and policy did.
//
// gRPC: every method of every service is answered with a
// google.protobuf.StringValue holding the same JSON.
//
// With --tls-cert and --tls-key, each --tls-listen address serves the same
// over TLS (HTTP/1.1), and answers name the server name the client sent (a
// backend outside the mesh for BackendTLSPolicy tests).
//
// `echo fetch URL...` is the client side, for images that hold nothing but
// this binary: it GETs each URL in turn, each on a new connection, copies the
// body to stdout and exits non-zero unless every answer was 2xx.
//
// `echo hold URL` is a long-lived client: one connection, a GET of URL on it
// every interval, a line per answer, until the connection ends (exit 1,
// saying how) or -for has passed (exit 0).
//
// `echo load URL` is steady traffic that counts: -c clients, each a GET of
// URL on a new connection every interval, until -for has passed or, with
// -for 0, its standard input ends (kubectl exec -i: the caller closes it);
// a line on stderr at the first answer (the traffic is flowing) and one per
// failure, then a JSON summary on stdout; exit 1 if any request failed.
// With -each, every request's outcome is a JSON line on stdout before the
// summary (Outcome: when, the status, which pod answered and the caller's
// identity it was told), so a test can judge each request on its own.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/causeway-mesh/causeway/pkg/version"
)

// maxBody bounds how much of a request body is read and echoed.
const maxBody = 1 << 20

type identity struct {
	Pod       string `json:"pod"`
	Namespace string `json:"namespace"`
}

// Echo is the JSON answer.
type Echo struct {
	Protocol  string              `json:"protocol"`
	Method    string              `json:"method"`
	Path      string              `json:"path"`
	Host      string              `json:"host"`
	Headers   map[string][]string `json:"headers"`
	Body      string              `json:"body,omitempty"`
	Pod       string              `json:"pod"`
	Namespace string              `json:"namespace"`
	Remote    string              `json:"remote"`
	// TLSServerName is the SNI of a request that came over TLS.
	TLSServerName string `json:"tls_server_name,omitempty"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "fetch" {
		os.Exit(fetchMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "hold" {
		os.Exit(holdMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "load" {
		os.Exit(loadMain(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	var listens, tlsListens stringList
	flag.Var(&listens, "listen", "address to serve on (repeatable)")
	flag.Var(&tlsListens, "tls-listen", "address to serve on over TLS (repeatable; needs --tls-cert and --tls-key)")
	certFile := flag.String("tls-cert", "", "PEM certificate chain for --tls-listen")
	keyFile := flag.String("tls-key", "", "PEM private key for --tls-listen")
	pod := flag.String("pod", os.Getenv("POD_NAME"), "pod name reported in answers")
	ns := flag.String("namespace", os.Getenv("POD_NAMESPACE"), "namespace reported in answers")
	idle := flag.Duration("idle-timeout", 2*time.Minute, "close keep-alive connections idle for this long")
	version.RegisterFlag(flag.CommandLine, "echo")
	flag.Parse()
	if len(listens)+len(tlsListens) == 0 {
		fmt.Fprintln(os.Stderr, "echo: at least one --listen or --tls-listen address is required")
		os.Exit(2)
	}
	var tlsConf *tls.Config
	if len(tlsListens) > 0 {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "echo: --tls-cert/--tls-key: %v\n", err)
			os.Exit(2)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var lns []net.Listener
	for _, a := range listens {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			fmt.Fprintf(os.Stderr, "echo: listen %s: %v\n", a, err)
			os.Exit(1)
		}
		lns = append(lns, ln)
	}
	for _, a := range tlsListens {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			fmt.Fprintf(os.Stderr, "echo: listen %s: %v\n", a, err)
			os.Exit(1)
		}
		lns = append(lns, tls.NewListener(ln, tlsConf))
	}
	if err := serve(ctx, lns, identity{Pod: *pod, Namespace: *ns}, *idle); err != nil {
		fmt.Fprintf(os.Stderr, "echo: %v\n", err)
		os.Exit(1)
	}
}

func serve(ctx context.Context, lns []net.Listener, id identity, idle time.Duration) error {
	gs := grpc.NewServer(grpc.UnknownServiceHandler(grpcEcho(id)))
	h := handler(id, gs)
	srv := &http.Server{
		Handler:           h2c.NewHandler(h, &http2.Server{}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       idle,
		MaxHeaderBytes:    64 << 10,
	}
	errc := make(chan error, len(lns))
	for _, ln := range lns {
		fmt.Fprintf(os.Stderr, "echo %s/%s listening on %s\n", id.Namespace, id.Pod, ln.Addr())
		go func() { errc <- srv.Serve(ln) }()
	}
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	case err := <-errc:
		return err
	}
}

func handler(id identity, gs *grpc.Server) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			gs.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
		if err != nil {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		e := Echo{
			Protocol: r.Proto, Method: r.Method, Path: r.URL.RequestURI(), Host: r.Host,
			Headers: r.Header, Body: string(body), Pod: id.Pod, Namespace: id.Namespace, Remote: r.RemoteAddr,
		}
		if r.TLS != nil {
			e.TLSServerName = r.TLS.ServerName
		}
		w.Header().Set("Content-Type", "application/json")
		// Let tests ask for a status: /status/503.
		status := http.StatusOK
		if rest, ok := strings.CutPrefix(r.URL.Path, "/status/"); ok {
			if _, err := fmt.Sscanf(rest, "%d", &status); err != nil || status < 200 || status > 599 {
				status = http.StatusBadRequest
			}
		}
		w.WriteHeader(status)
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(e)
	}
}

func grpcEcho(id identity) grpc.StreamHandler {
	return func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		in := new(wrapperspb.StringValue)
		if err := stream.RecvMsg(in); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		md, _ := metadata.FromIncomingContext(stream.Context())
		headers := map[string][]string{}
		keys := make([]string, 0, len(md))
		for k := range md {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			headers[k] = md[k]
		}
		host := ""
		if a := md.Get(":authority"); len(a) > 0 {
			host = a[0]
		}
		out, err := json.Marshal(Echo{Protocol: "gRPC", Method: "POST", Path: method, Host: host, Headers: headers,
			Body: in.GetValue(), Pod: id.Pod, Namespace: id.Namespace})
		if err != nil {
			return err
		}
		return stream.SendMsg(wrapperspb.String(string(out)))
	}
}

// fetchMain runs `echo fetch [-timeout D] URL...` and returns the exit code.
func fetchMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("echo fetch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 5*time.Second, "bound on each request, answer included")
	var headers stringList
	fs.Var(&headers, "H", `request header "Name: value" (repeatable), e.g. a traceparent`)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: echo fetch [-timeout D] [-H 'Name: value']... URL...")
		return 2
	}
	hdr := http.Header{}
	for _, h := range headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			fmt.Fprintf(stderr, "echo fetch: header %q: want \"Name: value\"\n", h)
			return 2
		}
		hdr.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	// A connection per URL, so requests to a Service spread over its
	// endpoints the way separate clients' would.
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, u := range fs.Args() {
		if err := fetch(client, u, hdr, stdout); err != nil {
			fmt.Fprintf(stderr, "echo fetch %s: %v\n", u, err)
			return 1
		}
	}
	return 0
}

func fetch(client *http.Client, url string, hdr http.Header, w io.Writer) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header = hdr.Clone()
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, io.LimitReader(resp.Body, maxBody)); err != nil {
		return err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// holdMain runs `echo hold [-interval D] [-for D] [-timeout D] URL` and
// returns the exit code. The connection is its own (no pool that would
// dial again behind its back): when it ends, hold ends.
func holdMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("echo hold", flag.ContinueOnError)
	fs.SetOutput(stderr)
	interval := fs.Duration("interval", 200*time.Millisecond, "time between requests")
	total := fs.Duration("for", time.Minute, "how long to hold the connection")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on the dial and on each answer")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: echo hold [-interval D] [-for D] [-timeout D] URL")
		return 2
	}
	u, err := url.Parse(fs.Arg(0))
	if err != nil || u.Scheme != "http" || u.Host == "" {
		fmt.Fprintf(stderr, "echo hold: %q is not an http:// URL\n", fs.Arg(0))
		return 2
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	conn, err := net.DialTimeout("tcp", addr, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "echo hold %s: %v\n", u, err)
		return 1
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	end := time.Now().Add(*total)
	for n := 1; time.Now().Before(end); n++ {
		req, err := http.NewRequest(http.MethodGet, u.String(), nil)
		if err != nil {
			fmt.Fprintf(stderr, "echo hold: %v\n", err)
			return 2
		}
		_ = conn.SetDeadline(time.Now().Add(*timeout))
		if err := req.Write(conn); err != nil {
			fmt.Fprintf(stderr, "echo hold %s: connection ended after %d answers: %v\n", u, n-1, err)
			return 1
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			fmt.Fprintf(stderr, "echo hold %s: connection ended after %d answers: %v\n", u, n-1, err)
			return 1
		}
		_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
		resp.Body.Close()
		if err != nil {
			fmt.Fprintf(stderr, "echo hold %s: connection ended after %d answers: %v\n", u, n-1, err)
			return 1
		}
		fmt.Fprintf(stdout, "answer %d: %s\n", n, resp.Status)
		if resp.Close {
			fmt.Fprintf(stderr, "echo hold %s: the server closed the connection after %d answers\n", u, n)
			return 1
		}
		time.Sleep(*interval)
	}
	return 0
}

// LoadSummary is what `echo load` prints when it ends.
type LoadSummary struct {
	Sent   int64 `json:"sent"`
	Failed int64 `json:"failed"`
	// First is when the first request was sent, Last when the last one
	// ended: the span the traffic covered.
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
	// FirstAnswer is when the first successful answer arrived (zero: none).
	FirstAnswer time.Time `json:"first_answer"`
	// Errors holds the first failures' messages (at most maxLoadErrors).
	Errors []string `json:"errors,omitempty"`
}

const maxLoadErrors = 20

// Outcome is one request of `echo load -each`.
type Outcome struct {
	Began time.Time `json:"began"`
	Ended time.Time `json:"ended"`
	// Status is the answer's HTTP status; 0 when there was none.
	Status int `json:"status,omitempty"`
	// Pod answered, and was told Principal (the mesh's
	// X-Causeway-Source-Principal); both empty unless the answer was an
	// echo's.
	Pod       string `json:"pod,omitempty"`
	Principal string `json:"principal,omitempty"`
	Error     string `json:"error,omitempty"`
}

// principalHeader is the caller's identity as a waypoint tells the
// destination (pkg/l7.SourcePrincipalHeader).
const principalHeader = "X-Causeway-Source-Principal"

// fetchOutcome GETs url and describes what came back.
func fetchOutcome(client *http.Client, url string) (o Outcome) {
	o.Began = time.Now()
	defer func() { o.Ended = time.Now() }()
	resp, err := client.Get(url)
	if err != nil {
		o.Error = err.Error()
		return o
	}
	defer resp.Body.Close()
	o.Status = resp.StatusCode
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		o.Error = err.Error()
		return o
	}
	var e Echo
	if json.Unmarshal(body, &e) == nil {
		o.Pod = e.Pod
		if p := e.Headers[principalHeader]; len(p) > 0 {
			o.Principal = p[0]
		}
	}
	if o.Status < 200 || o.Status > 299 {
		o.Error = "status " + resp.Status
	}
	return o
}

// loadAnswered begins load's line at the first answer.
const loadAnswered = "echo load: the first answer from "

// loadMain runs `echo load [-c N] [-interval D] [-timeout D] [-for D] URL`
// and returns the exit code.
func loadMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("echo load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	clients := fs.Int("c", 1, "clients sending at once (1-64)")
	interval := fs.Duration("interval", 20*time.Millisecond, "time between one client's requests")
	timeout := fs.Duration("timeout", 5*time.Second, "bound on each request, answer included")
	total := fs.Duration("for", 0, "how long to send; 0: until standard input ends")
	each := fs.Bool("each", false, "print every request's outcome as a JSON line on stdout")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 || *clients < 1 || *clients > 64 || *interval < 0 || *total < 0 {
		fmt.Fprintln(stderr, "usage: echo load [-c 1-64] [-interval D] [-timeout D] [-for D] [-each] URL")
		return 2
	}
	u := fs.Arg(0)
	if p, err := url.Parse(u); err != nil || p.Scheme != "http" || p.Host == "" {
		fmt.Fprintf(stderr, "echo load: %q is not an http:// URL\n", u)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if *total > 0 {
		ctx, cancel = context.WithTimeout(ctx, *total)
		defer cancel()
	} else {
		go func() {
			_, _ = io.Copy(io.Discard, stdin)
			cancel()
		}()
	}
	// A connection per request, as fetch: each request is a new
	// connection through the mesh, spread over the Service's endpoints.
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	out := json.NewEncoder(stdout)
	var mu sync.Mutex
	var sum LoadSummary
	answered := false
	done := make(chan struct{})
	for range *clients {
		go func() {
			defer func() { done <- struct{}{} }()
			for ctx.Err() == nil {
				o := fetchOutcome(client, u)
				mu.Lock()
				if *each {
					_ = out.Encode(o)
				}
				sum.Sent++
				if sum.First.IsZero() || o.Began.Before(sum.First) {
					sum.First = o.Began
				}
				if o.Ended.After(sum.Last) {
					sum.Last = o.Ended
				}
				if o.Error == "" && !answered {
					answered = true
					sum.FirstAnswer = o.Ended
					fmt.Fprintf(stderr, "%s%s\n", loadAnswered, u)
				}
				if o.Error != "" {
					sum.Failed++
					msg := fmt.Sprintf("%s (began %s) %s", o.Ended.UTC().Format(time.RFC3339Nano), o.Began.UTC().Format(time.RFC3339Nano), o.Error)
					fmt.Fprintf(stderr, "echo load %s: %s\n", u, msg)
					if len(sum.Errors) < maxLoadErrors {
						sum.Errors = append(sum.Errors, msg)
					}
				}
				mu.Unlock()
				select {
				case <-ctx.Done():
				case <-time.After(*interval):
				}
			}
		}()
	}
	for range *clients {
		<-done
	}
	if err := out.Encode(sum); err != nil {
		fmt.Fprintf(stderr, "echo load: %v\n", err)
		return 1
	}
	if sum.Failed > 0 {
		return 1
	}
	return 0
}

type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}
