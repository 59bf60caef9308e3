package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/util"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// DefaultMaxBodyBytes is how much of a request body goes into the input when
// body parsing is on and no limit is configured (Envoy's with_request_body
// max_request_bytes plays the same role).
const DefaultMaxBodyBytes = 8192

// Request is what the waypoint knows about one HTTP request when it asks for
// a decision. Source is the tunnel's peer: only an authenticated peer puts a
// principal into the input; nothing in the request can add one.
type Request struct {
	// HTTP is the request as parsed inside the tunnel. Its headers are read,
	// never changed.
	HTTP *http.Request
	// Body holds the first bytes of the body the waypoint buffered (nil: none).
	Body []byte
	// BodyTruncated reports that the body is longer than Body.
	BodyTruncated bool
	// Source is the peer of the HBONE tunnel the request arrived on.
	Source trust.Peer
	// SourceAddr and DestAddr are the caller's and the destination's addresses.
	SourceAddr, DestAddr netip.AddrPort
	// Destination is the identity of the destination workload (zero: unknown).
	Destination trust.Identity
	// ID identifies the request (Envoy's stream id); "" leaves it out.
	ID string
	// Scheme is the scheme of the inner request; "" derives it from the
	// request ("https" with TLS, else "http").
	Scheme string
	// Time is when the request's first byte arrived; zero means now.
	Time time.Time
}

// InputOptions controls the optional parts of the input.
type InputOptions struct {
	// ParseBody adds body, parsed_body and truncated_body, as OPA-Envoy does
	// when Envoy sends the body (with_request_body).
	ParseBody bool
	// MaxBodyBytes bounds the body bytes placed in the input; longer bodies
	// count as truncated. 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int
}

// BodyLimit is the number of body bytes the waypoint should buffer for the
// input: 0 when bodies are not parsed.
func (o InputOptions) BodyLimit() int {
	if !o.ParseBody {
		return 0
	}
	if o.MaxBodyBytes <= 0 {
		return DefaultMaxBodyBytes
	}
	return o.MaxBodyBytes
}

// ErrBadRequest is matched (errors.Is) by every error BuildInput returns for
// a request whose path, query or body cannot be parsed. Such requests get 400,
// as with OPA-Envoy.
var ErrBadRequest = errors.New("bad request")

// BadRequestError is a request that cannot be turned into policy input.
type BadRequestError struct {
	What string // "path", "query", "body"
	Err  error
}

func (e *BadRequestError) Error() string {
	return fmt.Sprintf("bad request: cannot parse %s: %v", e.What, e.Err)
}

// Unwrap returns the parse error.
func (e *BadRequestError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrBadRequest) hold.
func (e *BadRequestError) Is(target error) bool { return target == ErrBadRequest }

// StatusCode is the HTTP status for the request: 400.
func (e *BadRequestError) StatusCode() int { return http.StatusBadRequest }

// Keys and constant parts of the input, built once. ast values are not
// changed by evaluation, so they can be shared between inputs.
var (
	kAttributes          = ast.StringTerm("attributes")
	kSource              = ast.StringTerm("source")
	kDestination         = ast.StringTerm("destination")
	kAddress             = ast.StringTerm("address")
	kSocketAddress       = ast.StringTerm("socketAddress")
	kPortValue           = ast.StringTerm("portValue")
	kPrincipal           = ast.StringTerm("principal")
	kRequest             = ast.StringTerm("request")
	kHTTP                = ast.StringTerm("http")
	kID                  = ast.StringTerm("id")
	kMethod              = ast.StringTerm("method")
	kPath                = ast.StringTerm("path")
	kHost                = ast.StringTerm("host")
	kScheme              = ast.StringTerm("scheme")
	kProtocol            = ast.StringTerm("protocol")
	kHeaders             = ast.StringTerm("headers")
	kSize                = ast.StringTerm("size")
	kBody                = ast.StringTerm("body")
	kTime                = ast.StringTerm("time")
	kMetadataContext     = ast.StringTerm("metadataContext")
	kRouteMetadata       = ast.StringTerm("routeMetadataContext")
	kParsedPath          = ast.StringTerm("parsed_path")
	kParsedQuery         = ast.StringTerm("parsed_query")
	kParsedBody          = ast.StringTerm("parsed_body")
	kTruncatedBody       = ast.StringTerm("truncated_body")
	kVersion             = ast.StringTerm("version")
	kSourcePrincipal     = ast.StringTerm("source_principal")
	kDestinationPrincipl = ast.StringTerm("destination_principal")

	// Empty objects are never written to, so one term serves every input.
	emptyObjectTerm = ast.ObjectTerm()

	kPseudoAuthority = ast.StringTerm(":authority")
	kPseudoMethod    = ast.StringTerm(":method")
	kPseudoPath      = ast.StringTerm(":path")
	kPseudoScheme    = ast.StringTerm(":scheme")
	kTransferEnc     = ast.StringTerm("transfer-encoding")
	kPartialBody     = ast.StringTerm(headerPartialBody)

	versionTerm = ast.ObjectTerm(
		[2]*ast.Term{ast.StringTerm("encoding"), ast.StringTerm("protojson")},
		[2]*ast.Term{ast.StringTerm("ext_authz"), ast.StringTerm("v3")},
	)
)

// Headers that never reach the input. Envoy drops a client's
// x-envoy-auth-partial-body (it sets its own), and its default
// forward_client_cert_details (SANITIZE) removes a client's
// x-forwarded-client-cert before authorization: a header must never be
// able to claim a certificate the tunnel did not present.
const (
	headerPartialBody = "x-envoy-auth-partial-body"
	headerXFCC        = "x-forwarded-client-cert"
)

// BuildInput builds the OPA-Envoy (ext_authz v3) input document for req
// directly as an ast.Value. Principals come only from req.Source (when
// authenticated) and req.Destination; both are absent otherwise, as
// OPA-Envoy omits empty fields. A path, query or body that cannot be parsed
// gives a *BadRequestError.
func BuildInput(req *Request, opts InputOptions) (ast.Value, error) {
	d, err := newInputDoc(req, opts)
	if err != nil {
		return nil, err
	}
	return d.value(), nil
}

var errNoHTTPRequest = errors.New("policy input: no HTTP request")

// requestPath is the :path Envoy would report: the request target as sent.
func requestPath(r *http.Request) string {
	if r.RequestURI != "" && (r.RequestURI[0] == '/' || r.RequestURI == "*") {
		return r.RequestURI
	}
	if r.URL == nil {
		return ""
	}
	if r.Method == http.MethodConnect && r.URL.Path == "" {
		return ""
	}
	return r.URL.RequestURI()
}

func requestScheme(req *Request) string {
	if req.Scheme != "" {
		return req.Scheme
	}
	if req.HTTP.URL != nil && req.HTTP.URL.Scheme != "" {
		return req.HTTP.URL.Scheme
	}
	if req.HTTP.TLS != nil {
		return "https"
	}
	return "http"
}

// protocolString names the protocol as Envoy does ("HTTP/2", not "HTTP/2.0").
func protocolString(r *http.Request) string {
	switch {
	case r.ProtoMajor == 2:
		return "HTTP/2"
	case r.ProtoMajor == 3:
		return "HTTP/3"
	case r.ProtoMajor == 1 && r.ProtoMinor == 0:
		return "HTTP/1.0"
	case r.ProtoMajor == 1:
		return "HTTP/1.1"
	default:
		return r.Proto
	}
}

// requestSize follows Envoy's "bytes received" at authorization time: the
// declared length when known, else what was buffered.
func requestSize(r *http.Request, body []byte) int64 {
	if r.ContentLength >= 0 {
		return r.ContentLength
	}
	return int64(len(body))
}

// commonHeaders maps frequent canonical header names to shared lower-case
// key terms, saving allocations per request.
var commonHeaders = func() map[string]*ast.Term {
	names := []string{
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization",
		"Cache-Control", "Connection", "Content-Length", "Content-Type",
		"Cookie", "Forwarded", "Origin", "Referer", "Te", "Traceparent",
		"Tracestate", "Baggage", "User-Agent", "X-Forwarded-For",
		"X-Forwarded-Proto", "X-Request-Id", "Grpc-Timeout",
		"Grpc-Accept-Encoding", "Grpc-Encoding", "If-None-Match",
		"If-Modified-Since", "Range", "Upgrade", "Proxy-Authorization",
	}
	m := make(map[string]*ast.Term, len(names))
	for _, n := range names {
		m[n] = ast.StringTerm(strings.ToLower(n))
	}
	return m
}()

func headerKeyTerm(name string) *ast.Term {
	if t, ok := commonHeaders[name]; ok {
		return t
	}
	return ast.StringTerm(strings.ToLower(name))
}

// constTerms holds terms for values that recur on every request (methods,
// schemes, protocols); terms are immutable, so they are shared.
var constTerms = func() map[string]*ast.Term {
	m := map[string]*ast.Term{}
	for _, v := range []string{
		"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE",
		"http", "https", "HTTP/1.0", "HTTP/1.1", "HTTP/2", "HTTP/3", "true", "false",
	} {
		m[v] = ast.StringTerm(v)
	}
	return m
}()

func constTerm(s string) *ast.Term {
	if t, ok := constTerms[s]; ok {
		return t
	}
	return ast.StringTerm(s)
}

// parsePathAndQuery splits :path as OPA-Envoy does: the path unescaped and
// split into segments (without the leading "/"), the query as a map of
// arrays. Bad escapes or a malformed query are a bad request.
func parsePathAndQuery(path string) (*ast.Term, *ast.Term, error) {
	rawPath, rawQuery, _ := strings.Cut(path, "?")
	decoded, err := url.PathUnescape(rawPath)
	if err != nil {
		return nil, nil, &BadRequestError{What: "path", Err: err}
	}
	segs := strings.Split(strings.TrimLeft(decoded, "/"), "/")
	terms := make([]*ast.Term, len(segs))
	for i, s := range segs {
		terms[i] = ast.StringTerm(s)
	}
	if rawQuery == "" {
		return ast.ArrayTerm(terms...), emptyObjectTerm, nil
	}
	values, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, nil, &BadRequestError{What: "query", Err: err}
	}
	query := ast.NewObjectWithCapacity(len(values))
	for k, vs := range values {
		query.Insert(ast.StringTerm(k), stringArray(vs))
	}
	return ast.ArrayTerm(terms...), ast.NewTerm(query), nil
}

func stringArray(vs []string) *ast.Term {
	terms := make([]*ast.Term, len(vs))
	for i, v := range vs {
		terms[i] = ast.StringTerm(v)
	}
	return ast.ArrayTerm(terms...)
}

// parseBody parses JSON and form bodies as OPA-Envoy does (content type
// matched by substring); other types give nil (parsed_body null).
func parseBody(r *http.Request, body []byte) (ast.Value, error) {
	ct := r.Header.Get("Content-Type")
	switch {
	case ct == "":
		return nil, nil
	case strings.Contains(ct, "application/json"):
		v, err := jsonValue(body)
		if err != nil {
			return nil, &BadRequestError{What: "body", Err: err}
		}
		return v, nil
	case strings.Contains(ct, "application/x-www-form-urlencoded"):
		values, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, &BadRequestError{What: "body", Err: err}
		}
		obj := ast.NewObjectWithCapacity(len(values))
		for k, vs := range values {
			obj.Insert(ast.StringTerm(k), stringArray(vs))
		}
		return obj, nil
	case strings.Contains(ct, "multipart/form-data"):
		return parseMultipart(ct, body)
	default:
		return nil, nil
	}
}

func jsonValue(b []byte) (ast.Value, error) {
	var x any
	if err := util.UnmarshalJSON(b, &x); err != nil {
		return nil, err
	}
	return ast.InterfaceToValue(x)
}

// maxMultipartParts bounds the parts of one body, whose size is already
// bounded: many empty parts would still cost an allocation each.
const maxMultipartParts = 1000

// parseMultipart gives each named part's content under its form name, in
// order, as OPA-Envoy does: a part of type application/json as its JSON
// value, any other as a string. Parts without a form name are skipped;
// without a boundary there is nothing to parse (parsed_body null).
func parseMultipart(contentType string, body []byte) (ast.Value, error) {
	_, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return nil, &BadRequestError{What: "body", Err: fmt.Errorf("content type: %w", err)}
	}
	boundary := params["boundary"]
	if boundary == "" {
		return nil, nil
	}
	values := map[string][]*ast.Term{}
	var names []string // first-seen order, so the object is built deterministically
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for n := 0; ; n++ {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err == nil && n >= maxMultipartParts {
			err = fmt.Errorf("more than %d parts", maxMultipartParts)
		}
		if err != nil {
			return nil, &BadRequestError{What: "body", Err: fmt.Errorf("multipart: %w", err)}
		}
		name := part.FormName()
		if name == "" {
			continue
		}
		content, err := io.ReadAll(part)
		if err != nil {
			return nil, &BadRequestError{What: "body", Err: fmt.Errorf("multipart part %q: %w", name, err)}
		}
		value := ast.StringTerm(sanitizeUTF8(content))
		if strings.Contains(part.Header.Get("Content-Type"), "application/json") {
			v, err := jsonValue(content)
			if err != nil {
				return nil, &BadRequestError{What: "body", Err: fmt.Errorf("multipart part %q: %w", name, err)}
			}
			value = ast.NewTerm(v)
		}
		if _, seen := values[name]; !seen {
			names = append(names, name)
		}
		values[name] = append(values[name], value)
	}
	obj := ast.NewObjectWithCapacity(len(names))
	for _, name := range names {
		obj.Insert(ast.StringTerm(name), ast.ArrayTerm(values[name]...))
	}
	return obj, nil
}

// protoTimestamp formats t as protobuf JSON does: UTC, "Z", and 0, 3, 6 or 9
// fractional digits.
func protoTimestamp(t time.Time) string {
	t = t.UTC()
	var buf [40]byte
	b := t.AppendFormat(buf[:0], "2006-01-02T15:04:05")
	ns := t.Nanosecond()
	digits := 9
	switch {
	case ns == 0:
		digits = 0
	case ns%1_000_000 == 0:
		ns, digits = ns/1_000_000, 3
	case ns%1_000 == 0:
		ns, digits = ns/1_000, 6
	}
	if digits > 0 {
		b = append(b, '.')
		start := len(b)
		b = append(b, "000000000"[:digits]...)
		for i := len(b) - 1; i >= start; i-- {
			b[i] = byte('0' + ns%10)
			ns /= 10
		}
	}
	b = append(b, 'Z')
	return string(b)
}

// sanitizeUTF8 replaces each invalid byte with '!', as Envoy does before
// putting a body into a protobuf string.
func sanitizeUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b))
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			sb.WriteByte('!')
		} else {
			sb.Write(b[:size])
		}
		b = b[size:]
	}
	return sb.String()
}
