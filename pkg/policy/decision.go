package policy

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/open-policy-agent/opa/v1/rego"
)

// Decision is the outcome of one authorization. A zero Decision denies.
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
// body and http_status. Anything else denies.
func interpret(rs rego.ResultSet) Decision {
	switch {
	case len(rs) == 0:
		return deny(http.StatusForbidden, "undefined decision")
	case len(rs) > 1:
		return deny(http.StatusInternalServerError, fmt.Sprintf("%d results for the decision, want 1", len(rs)))
	case len(rs[0].Expressions) != 1:
		return deny(http.StatusInternalServerError, "decision query gave no single value")
	}
	d, err := fromValue(rs[0].Expressions[0].Value)
	if err != nil {
		return deny(http.StatusInternalServerError, err.Error())
	}
	return d
}

func fromValue(v any) (Decision, error) {
	switch v := v.(type) {
	case bool:
		if v {
			return Decision{Allowed: true, Status: http.StatusOK, Reason: "allowed by policy"}, nil
		}
		return deny(http.StatusForbidden, "denied by policy"), nil
	case map[string]any:
		return fromObject(v)
	default:
		return Decision{}, fmt.Errorf("%w: decision is %s, want boolean or object", errMalformed, typeName(v))
	}
}

func fromObject(obj map[string]any) (Decision, error) {
	raw, ok := obj["allowed"]
	if !ok {
		return Decision{}, fmt.Errorf("%w: object has no \"allowed\"", errMalformed)
	}
	allowed, ok := raw.(bool)
	if !ok {
		return Decision{}, fmt.Errorf("%w: \"allowed\" is %s, want boolean", errMalformed, typeName(raw))
	}
	var d Decision
	var err error
	if d.Headers, err = headersField(obj, "headers"); err != nil {
		return Decision{}, err
	}
	if d.ResponseHeadersToAdd, err = headersField(obj, "response_headers_to_add"); err != nil {
		return Decision{}, err
	}
	if d.RequestHeadersToRemove, err = stringsField(obj, "request_headers_to_remove"); err != nil {
		return Decision{}, err
	}
	if b, ok := obj["body"]; ok {
		s, ok := b.(string)
		if !ok {
			return Decision{}, fmt.Errorf("%w: \"body\" is %s, want string", errMalformed, typeName(b))
		}
		d.Body = s
	}
	status := http.StatusForbidden
	if s, ok := obj["http_status"]; ok {
		if status, err = statusField(s); err != nil {
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

func statusField(v any) (int, error) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%w: \"http_status\" is %s, want number", errMalformed, typeName(v))
	}
	code, err := n.Int64()
	if err != nil || code < 100 || code > 599 || http.StatusText(int(code)) == "" {
		return 0, fmt.Errorf("%w: \"http_status\" %s is not an HTTP status", errMalformed, n)
	}
	return int(code), nil
}

// headersField reads an object of string or array-of-string values, or an
// array of such objects (OPA-Envoy accepts both).
func headersField(obj map[string]any, name string) (http.Header, error) {
	raw, ok := obj[name]
	if !ok {
		return nil, nil
	}
	h := http.Header{}
	add := func(m map[string]any) error {
		for k, v := range m {
			if !validHeaderName(k) {
				return fmt.Errorf("%w: %q has invalid header name %q", errMalformed, name, k)
			}
			switch v := v.(type) {
			case string:
				if !validHeaderValue(v) {
					return fmt.Errorf("%w: %q has invalid value for %q", errMalformed, name, k)
				}
				h.Add(k, v)
			case []any:
				for _, e := range v {
					s, ok := e.(string)
					if !ok || !validHeaderValue(s) {
						return fmt.Errorf("%w: %q has a non-string or invalid value for %q", errMalformed, name, k)
					}
					h.Add(k, s)
				}
			default:
				return fmt.Errorf("%w: %q value for %q is %s, want string or array", errMalformed, name, k, typeName(v))
			}
		}
		return nil
	}
	switch raw := raw.(type) {
	case map[string]any:
		if err := add(raw); err != nil {
			return nil, err
		}
	case []any:
		for _, e := range raw {
			m, ok := e.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%w: %q element is %s, want object", errMalformed, name, typeName(e))
			}
			if err := add(m); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("%w: %q is %s, want object", errMalformed, name, typeName(raw))
	}
	return h, nil
}

func stringsField(obj map[string]any, name string) ([]string, error) {
	raw, ok := obj[name]
	if !ok {
		return nil, nil
	}
	arr, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: %q is %s, want array of strings", errMalformed, name, typeName(raw))
	}
	out := make([]string, 0, len(arr))
	for _, e := range arr {
		s, ok := e.(string)
		if !ok || !validHeaderName(s) {
			return nil, fmt.Errorf("%w: %q has a non-string or invalid header name", errMalformed, name)
		}
		out = append(out, s)
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

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	default:
		return fmt.Sprintf("%T", v)
	}
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
