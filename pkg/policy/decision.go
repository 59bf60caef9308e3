package policy

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// Decision is the outcome of one authorization. A zero Decision denies.
//
// Its header maps and lists are read only: decisions the decision cache
// reuses share them, so a caller that changed one would change the answer
// of later requests.
type Decision struct {
	// Allowed lets the request through.
	Allowed bool `json:"allowed"`
	// Status is 200 when allowed; on deny the policy's http_status, else 403
	// (policy said no or said nothing), 400 (input could not be built) or 500
	// (no policy, evaluation error, malformed result).
	Status int `json:"status"`
	// Headers are added to the upstream request when allowed, and sent with
	// the denial otherwise (OPA-Envoy "headers").
	Headers http.Header `json:"headers,omitempty"`
	// ResponseHeadersToAdd are added to the response sent downstream when allowed.
	ResponseHeadersToAdd http.Header `json:"response_headers_to_add,omitempty"`
	// RequestHeadersToRemove are removed from the upstream request when allowed.
	RequestHeadersToRemove []string `json:"request_headers_to_remove,omitempty"`
	// Body is the body of the denial ("" for none).
	Body string `json:"body,omitempty"`
	// Reason says why, for logs; never sent to the client.
	Reason string `json:"reason"`
	// ID identifies the decision in logs.
	ID string `json:"decision_id"`
	// Revision is the policy revision that decided ("" when none was active).
	Revision string `json:"revision,omitempty"`
}

func deny(status int, reason string) Decision {
	return Decision{Status: status, Reason: reason}
}

// errMalformed marks results whose shape is wrong: a policy bug, so 500.
var errMalformed = errors.New("malformed policy result")

// interpret turns the result set of the decision query into a Decision, the
// way OPA-Envoy reads it: a boolean, or an object with a boolean "allowed"
// and optional headers, response_headers_to_add, request_headers_to_remove,
// body and http_status. Anything else denies. Results are ast values (the
// prepared query skips the conversion to Go values); they may be shared with
// the compiled policy, so they are only read.
func interpret(rs rego.ResultSet) Decision {
	switch {
	case len(rs) == 0:
		return deny(http.StatusForbidden, "undefined decision")
	case len(rs) > 1:
		return deny(http.StatusInternalServerError, fmt.Sprintf("%d results for the decision, want 1", len(rs)))
	case len(rs[0].Expressions) != 1:
		return deny(http.StatusInternalServerError, "decision query gave no single value")
	}
	v, err := resultValue(rs[0].Expressions[0].Value)
	if err != nil {
		return deny(http.StatusInternalServerError, err.Error())
	}
	d, err := fromValue(v)
	if err != nil {
		return deny(http.StatusInternalServerError, err.Error())
	}
	return d
}

// resultValue accepts ast values (the engine's query) and Go values (any
// other query), so the reading rules exist once.
func resultValue(x any) (ast.Value, error) {
	switch x := x.(type) {
	case ast.Value:
		return x, nil
	case *ast.Term:
		return x.Value, nil
	default:
		v, err := ast.InterfaceToValue(x)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errMalformed, err)
		}
		return v, nil
	}
}

func fromValue(v ast.Value) (Decision, error) {
	switch v := v.(type) {
	case ast.Boolean:
		if v {
			return Decision{Allowed: true, Status: http.StatusOK, Reason: "allowed by policy"}, nil
		}
		return deny(http.StatusForbidden, "denied by policy"), nil
	case ast.Object:
		return fromObject(v)
	default:
		return Decision{}, fmt.Errorf("%w: decision is %s, want boolean or object", errMalformed, ast.ValueName(v))
	}
}

var (
	kAllowed                = ast.StringTerm("allowed")
	kResponseHeadersToAdd   = ast.StringTerm("response_headers_to_add")
	kRequestHeadersToRemove = ast.StringTerm("request_headers_to_remove")
	kHTTPStatus             = ast.StringTerm("http_status")
)

func fromObject(obj ast.Object) (Decision, error) {
	raw := obj.Get(kAllowed)
	if raw == nil {
		return Decision{}, fmt.Errorf("%w: object has no \"allowed\"", errMalformed)
	}
	allowed, ok := raw.Value.(ast.Boolean)
	if !ok {
		return Decision{}, fmt.Errorf("%w: \"allowed\" is %s, want boolean", errMalformed, ast.ValueName(raw.Value))
	}
	var d Decision
	var err error
	if d.Headers, err = headersField(obj, kHeaders); err != nil {
		return Decision{}, err
	}
	if d.ResponseHeadersToAdd, err = headersField(obj, kResponseHeadersToAdd); err != nil {
		return Decision{}, err
	}
	if d.RequestHeadersToRemove, err = stringsField(obj, kRequestHeadersToRemove); err != nil {
		return Decision{}, err
	}
	if b := obj.Get(kBody); b != nil {
		s, ok := b.Value.(ast.String)
		if !ok {
			return Decision{}, fmt.Errorf("%w: \"body\" is %s, want string", errMalformed, ast.ValueName(b.Value))
		}
		d.Body = string(s)
	}
	status := http.StatusForbidden
	if s := obj.Get(kHTTPStatus); s != nil {
		if status, err = statusField(s.Value); err != nil {
			return Decision{}, err
		}
	}
	if allowed {
		d.Allowed = true
		d.Status = http.StatusOK
		d.Reason = "allowed by policy"
	} else {
		d.Status = status
		d.Reason = "denied by policy"
	}
	return d, nil
}

func statusField(v ast.Value) (int, error) {
	n, ok := v.(ast.Number)
	if !ok {
		return 0, fmt.Errorf("%w: \"http_status\" is %s, want number", errMalformed, ast.ValueName(v))
	}
	code, ok := n.Int()
	if !ok || code < 100 || code > 599 || http.StatusText(code) == "" {
		return 0, fmt.Errorf("%w: \"http_status\" %s is not an HTTP status", errMalformed, n)
	}
	return code, nil
}

// headersField reads an object of string or array-of-string values, or an
// array of such objects (OPA-Envoy accepts both).
func headersField(obj ast.Object, key *ast.Term) (http.Header, error) {
	raw := obj.Get(key)
	if raw == nil {
		return nil, nil
	}
	name := string(key.Value.(ast.String))
	h := http.Header{}
	add := func(m ast.Object) error {
		return m.Iter(func(k, v *ast.Term) error {
			ks, ok := k.Value.(ast.String)
			if !ok || !validHeaderName(string(ks)) {
				return fmt.Errorf("%w: %q has invalid header name %v", errMalformed, name, k)
			}
			switch v := v.Value.(type) {
			case ast.String:
				if !validHeaderValue(string(v)) {
					return fmt.Errorf("%w: %q has invalid value for %q", errMalformed, name, ks)
				}
				h.Add(string(ks), string(v))
			case *ast.Array:
				for i := 0; i < v.Len(); i++ {
					s, ok := v.Elem(i).Value.(ast.String)
					if !ok || !validHeaderValue(string(s)) {
						return fmt.Errorf("%w: %q has a non-string or invalid value for %q", errMalformed, name, ks)
					}
					h.Add(string(ks), string(s))
				}
			default:
				return fmt.Errorf("%w: %q value for %q is %s, want string or array", errMalformed, name, ks, ast.ValueName(v))
			}
			return nil
		})
	}
	switch raw := raw.Value.(type) {
	case ast.Object:
		if err := add(raw); err != nil {
			return nil, err
		}
	case *ast.Array:
		for i := 0; i < raw.Len(); i++ {
			m, ok := raw.Elem(i).Value.(ast.Object)
			if !ok {
				return nil, fmt.Errorf("%w: %q element is %s, want object", errMalformed, name, ast.ValueName(raw.Elem(i).Value))
			}
			if err := add(m); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("%w: %q is %s, want object", errMalformed, name, ast.ValueName(raw))
	}
	return h, nil
}

// stringsField reads an array (or set) of header names.
func stringsField(obj ast.Object, key *ast.Term) ([]string, error) {
	raw := obj.Get(key)
	if raw == nil {
		return nil, nil
	}
	name := string(key.Value.(ast.String))
	var out []string
	collect := func(t *ast.Term) error {
		s, ok := t.Value.(ast.String)
		if !ok || !validHeaderName(string(s)) {
			return fmt.Errorf("%w: %q has a non-string or invalid header name", errMalformed, name)
		}
		out = append(out, string(s))
		return nil
	}
	switch raw := raw.Value.(type) {
	case *ast.Array:
		for i := 0; i < raw.Len(); i++ {
			if err := collect(raw.Elem(i)); err != nil {
				return nil, err
			}
		}
	case ast.Set:
		if err := raw.Iter(collect); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: %q is %s, want array of strings", errMalformed, name, ast.ValueName(raw))
	}
	return out, nil
}

// validHeaderName accepts RFC 9110 token characters only, so a policy can
// never smuggle a line break into a header.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\r' || c == '\n' || c == 0 || (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// newDecisionID returns a random UUID (version 4) as decision id.
func newDecisionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:])
}
