package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap/zapcore"

	"github.com/causeway-mesh/causeway/pkg/logging"
)

// logLine writes ev through a DecisionLogger into the waypoint's JSON
// logger, and returns the line decoded with numbers kept as written.
func logLine(t *testing.T, opts DecisionLogOptions, ev DecisionEvent) map[string]any {
	t.Helper()
	var buf bytes.Buffer
	log, err := logging.New(logging.Options{Output: zapcore.AddSync(&buf)})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := NewDecisionLogger(log.Logger, opts)
	if err != nil {
		t.Fatal(err)
	}
	dl.write(ev)
	dec := json.NewDecoder(&buf)
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("decision log line is not JSON: %v\n%s", err, buf.String())
	}
	return m
}

// The decision log writes ast values straight into zap's encoder; what it
// writes must decode to what ast.JSON makes of the same value.
func TestDecisionLogRendersValuesAsASTJSON(t *testing.T) {
	for _, src := range []string{
		`{"s": "text \"quoted\" \u00e9 <tag> & \n", "t": true, "f": false, "n": null}`,
		`{"int": 42, "neg": -7, "float": 1.5, "exp": 1e3, "big": 123456789012345678901234567890, "frac": 0.000001}`,
		`{"arr": [1, "a", [true, null], {"k": "v"}], "empty_arr": [], "empty_obj": {}}`,
		`{"set": {"b", "a", "c"}, "nums": {3, 1, 2}, "objs": {{"x": 1}}}`,
		`{1: "one", "two": 2, [1, "a"]: "array key", {"k": 1}: "object key", true: "bool key", null: "null key"}`,
		`{"deep": {"a": {"b": {"c": {"d": [{"e": {"f", "g"}}]}}}}}`,
		`["top", "level", "array"]`,
		`"just a string"`,
		`17`,
		`false`,
	} {
		v, err := ast.ParseTerm(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		want, err := ast.JSON(v.Value)
		if err != nil {
			t.Fatalf("%s: ast.JSON: %v", src, err)
		}
		// Round trip the expectation through encoding/json so both sides
		// decode the same way (json.Number for numbers).
		raw, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var wantDecoded any
		if err := dec.Decode(&wantDecoded); err != nil {
			t.Fatal(err)
		}
		m := logLine(t, DecisionLogOptions{}, DecisionEvent{Input: v.Value, Result: v.Value, Time: time.Now()})
		for _, field := range []string{"input", "result"} {
			if !reflect.DeepEqual(m[field], wantDecoded) {
				t.Errorf("%s: %s logged as\n%#v\nwant (ast.JSON)\n%#v", src, field, m[field], wantDecoded)
			}
		}
	}
}

// Any string, as a key or a value, is written as a JSON string that
// decodes to what encoding/json makes of it (invalid UTF-8 included).
func FuzzDecisionLogStrings(f *testing.F) {
	for _, s := range []string{"", "plain", "q\"uote\\", "\x00\x1f\x7f\n\r\t", "é€😀", "\xff\xfe bad", "a\xe2\x82", "\u2028\u2029", "<&>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := ast.NewObject([2]*ast.Term{ast.StringTerm(s), ast.ArrayTerm(ast.StringTerm(s))})
		got := appendJSON(nil, v, nil)
		want, err := json.Marshal(map[string][]string{s: {s}})
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%q written as invalid JSON %s: %v", s, got, err)
		}
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("%q written as %s, decodes to %#v, want %#v", s, got, g, w)
		}
	})
}

func TestDecisionLogRedaction(t *testing.T) {
	input := ast.MustParseTerm(`{
		"attributes": {"request": {"http": {
			"headers": {"authorization": "Bearer t", "cookie": "c", "x-api-key": "k", "accept": "*/*"},
			"body": "{\"password\": \"p\"}"
		}}},
		"parsed_body": {"password": "p"},
		"parsed_query": {"cookie": ["not a header"]}
	}`).Value
	result := ast.MustParseTerm(`{
		"allowed": false,
		"body": "secret body",
		"headers": [{"Set-Cookie": "s"}, {"x-a": ["1", "2"]}],
		"response_headers_to_add": {"authorization": "a", "x-ok": "1"}
	}`).Value
	ev := DecisionEvent{Input: input, Result: result, Time: time.Now()}

	m := logLine(t, DecisionLogOptions{MaskHeaders: []string{"X-Api-Key"}}, ev)
	in := m["input"].(map[string]any)
	h := dig(in, "attributes", "request", "http")
	headers := h["headers"].(map[string]any)
	for name, want := range map[string]any{"authorization": Masked, "cookie": Masked, "x-api-key": Masked, "accept": "*/*"} {
		if headers[name] != want {
			t.Errorf("input header %s = %v, want %v", name, headers[name], want)
		}
	}
	if h["body"] != Masked || in["parsed_body"] != Masked {
		t.Errorf("bodies not masked: body %v, parsed_body %v", h["body"], in["parsed_body"])
	}
	if q := in["parsed_query"].(map[string]any)["cookie"]; !reflect.DeepEqual(q, []any{"not a header"}) {
		t.Errorf("parsed_query masked too: %v", q)
	}
	res := m["result"].(map[string]any)
	if res["body"] != Masked {
		t.Errorf("result body = %v, want masked", res["body"])
	}
	hs := res["headers"].([]any)
	if hs[0].(map[string]any)["Set-Cookie"] != Masked || !reflect.DeepEqual(hs[1].(map[string]any)["x-a"], []any{"1", "2"}) {
		t.Errorf("result headers = %v", hs)
	}
	if rh := res["response_headers_to_add"].(map[string]any); rh["authorization"] != Masked || rh["x-ok"] != "1" {
		t.Errorf("result response_headers_to_add = %v", rh)
	}

	m = logLine(t, DecisionLogOptions{LogBodies: true}, ev)
	in = m["input"].(map[string]any)
	if b := dig(in, "attributes", "request", "http")["body"]; b != `{"password": "p"}` {
		t.Errorf("LogBodies: body = %v", b)
	}
	if pb := in["parsed_body"].(map[string]any); pb["password"] != "p" {
		t.Errorf("LogBodies: parsed_body = %v", pb)
	}
	if res := m["result"].(map[string]any); res["body"] != "secret body" {
		t.Errorf("LogBodies: result body = %v", res["body"])
	}

	// A null parsed_body (a body that is not JSON or a form) stays null.
	nullBody := ast.MustParseTerm(`{"parsed_body": null}`).Value
	m = logLine(t, DecisionLogOptions{}, DecisionEvent{Input: nullBody, Time: time.Now()})
	if pb, ok := m["input"].(map[string]any)["parsed_body"]; !ok || pb != nil {
		t.Errorf("null parsed_body logged as %v (present %v)", pb, ok)
	}
}

// BenchmarkDecisionLogWrite is the decision logger's work per decision
// (encoding the benchmark request's input and an object result to JSON).
func BenchmarkDecisionLogWrite(b *testing.B) {
	doc, err := newInputDoc(benchRequest(b), InputOptions{})
	if err != nil {
		b.Fatal(err)
	}
	res := ast.MustParseTerm(`{"allowed": true, "headers": {"x-authz-policy": "example"}}`).Value
	log, err := logging.New(logging.Options{Output: zapcore.AddSync(discard{})})
	if err != nil {
		b.Fatal(err)
	}
	dl, err := NewDecisionLogger(log.Buffered("decisions"), DecisionLogOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ev := DecisionEvent{Decision: Decision{Allowed: true, Status: 200, ID: newDecisionID()}, Path: "data.envoy.authz.allow", doc: doc, Result: res, Time: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		dl.write(ev)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// The decision log writes a request's headers as they were when it was
// decided, though it writes later, from its own goroutine: headers are read
// from the request lazily, and before the log takes the input.
func TestDecisionLogTakesHeadersAtDecision(t *testing.T) {
	var buf bytes.Buffer
	log, err := logging.New(logging.Options{Output: zapcore.AddSync(&buf)})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := NewDecisionLogger(log.Logger, DecisionLogOptions{Mode: LogAllDecisions})
	if err != nil {
		t.Fatal(err)
	}
	e, _ := loadEngine(t, Options{Dir: "testdata/example", DecisionLog: dl})
	req := benchRequest(t)
	req.HTTP.Header.Set("X-Before", "yes")
	e.Decide(context.Background(), req)
	req.HTTP.Header.Del("X-Before")
	req.HTTP.Header.Set("X-After", "yes")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dl.Run(ctx) // writes what is queued
	var line struct {
		Input struct {
			Attributes struct {
				Request struct {
					HTTP struct {
						Headers map[string]string `json:"headers"`
					} `json:"http"`
				} `json:"request"`
			} `json:"attributes"`
		} `json:"input"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	h := line.Input.Attributes.Request.HTTP.Headers
	if h["x-before"] != "yes" || h["x-after"] != "" {
		t.Fatalf("logged headers %v", h)
	}
}
