package policy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"
)

// checkDocAgrees checks that what a decision is keyed on (find), what is
// evaluated (value) and what is logged (appendJSON) are one document: at
// every path find gives what value().Find gives, present or absent, and the
// logged JSON is the value's under every redaction the logger applies.
func checkDocAgrees(t testing.TB, d *inputDoc) {
	t.Helper()
	v := d.value()
	for _, p := range probePaths(v) {
		got, found := d.find(p)
		want, err := v.Find(p)
		switch {
		case found != (err == nil):
			t.Fatalf("%v: find says present=%v, the value says %v", p, found, err)
		case found && got.Compare(want) != 0:
			t.Fatalf("%v: find gives %v, the value holds %v", p, got, want)
		}
		l := resolve(p)
		if key, want := d.appendKey(nil, &l), (astInput{v}).appendKey(nil, &l); !bytes.Equal(key, want) {
			t.Fatalf("%v: key %q, the value's key %q", p, key, want)
		}
	}
	for _, opts := range []DecisionLogOptions{{}, {LogBodies: true, MaskHeaders: []string{"Accept", "X-Custom"}}} {
		l, err := NewDecisionLogger(zap.NewNop(), opts)
		if err != nil {
			t.Fatal(err)
		}
		built := appendJSON(nil, v, l.inputRedaction)
		memo := termJSON{}
		for _, m := range []termJSON{nil, memo, memo} { // the second use of memo reads it
			direct := d.appendJSON(nil, l.inputRedaction, m)
			if !sameJSON(t, direct, built) {
				t.Fatalf("logged input differs from the evaluated one (memo %v):\n%s\nwant\n%s", m != nil, direct, built)
			}
		}
	}
}

// probePaths are every path into v, plus, under each object, a member it
// does not have and a number, under each array an index past its end, and
// a step below each scalar; and every member the schema can hold.
func probePaths(v ast.Value) []ast.Ref {
	var paths []ast.Ref
	var walk func(prefix ast.Ref, v ast.Value)
	walk = func(prefix ast.Ref, v ast.Value) {
		at := func(t *ast.Term) ast.Ref { return append(prefix[:len(prefix):len(prefix)], t) }
		paths = append(paths, prefix)
		switch v := v.(type) {
		case ast.Object:
			v.Foreach(func(k, val *ast.Term) { walk(at(k), val.Value) })
			paths = append(paths, at(ast.StringTerm("no-such-member")), at(ast.InternedTerm(0)))
		case *ast.Array:
			for i := range v.Len() {
				walk(at(ast.InternedTerm(i)), v.Elem(i).Value)
			}
			paths = append(paths, at(ast.InternedTerm(v.Len())), at(ast.StringTerm("0")))
		default:
			paths = append(paths, at(ast.StringTerm("below")))
		}
	}
	walk(ast.Ref{}, v)
	var schema func(prefix ast.Ref, f *inputField)
	schema = func(prefix ast.Ref, f *inputField) {
		for i := range f.fields {
			p := append(prefix[:len(prefix):len(prefix)], f.fields[i].key)
			paths = append(paths, p)
			schema(p, &f.fields[i])
		}
	}
	schema(ast.Ref{}, &inputSchema)
	return paths[1:] // not the empty path: input as a whole is never a key
}

func sameJSON(t testing.TB, a, b []byte) bool {
	t.Helper()
	decode := func(raw []byte) any {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var x any
		if err := dec.Decode(&x); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, raw)
		}
		return x
	}
	return reflect.DeepEqual(decode(a), decode(b))
}

func TestInputDocAgrees(t *testing.T) {
	p := newPeers(t)
	for name, tc := range goldenCases(t, p) {
		d, err := newInputDoc(tc.req, tc.opts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		checkDocAgrees(t, d)
	}
	d, err := newInputDoc(benchRequest(t), InputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkDocAgrees(t, d)

	// Sparse: no principals, addresses, host, path or id; CONNECT has no
	// :scheme; repeated and differently spelled names merge.
	r := &http.Request{Method: http.MethodConnect, Proto: "HTTP/2.0", ProtoMajor: 2, Header: http.Header{
		"X-Custom": {"b", "a"}, "x-custom": {"c"}, "Accept": {"*/*"}, "Empty": {},
	}, TransferEncoding: []string{"chunked"}}
	d, err = newInputDoc(&Request{HTTP: r, Source: p.tlsOnly}, InputOptions{ParseBody: true})
	if err != nil {
		t.Fatal(err)
	}
	checkDocAgrees(t, d)
	headers, _ := d.find(ast.MustParseRef("input.attributes.request.http.headers")[1:])
	if want := ast.MustParseTerm(`{":method": "CONNECT", "accept": "*/*", "transfer-encoding": "chunked", "x-custom": "b,a,c"}`).Value; headers.Compare(want) != 0 {
		t.Errorf("headers = %v, want %v", headers, want)
	}
}

// The decision log's term memo renders a term once, answers from memory
// afterwards and never holds more than maxTermJSON terms.
func TestTermJSONBounded(t *testing.T) {
	m := termJSON{}
	peer := ast.MustParseTerm(`{"address": {"socketAddress": {"address": "127.0.0.1", "portValue": 80}}}`)
	first := string(m.append(nil, peer))
	if again := string(m.append([]byte("x"), peer)); again != "x"+first || first != string(appendJSON(nil, peer.Value, nil)) {
		t.Fatalf("memo gives %s then %s", first, again)
	}
	for i := range maxTermJSON + 10 {
		m.append(nil, ast.InternedTerm(i+1000))
		if len(m) > maxTermJSON {
			t.Fatalf("memo holds %d terms", len(m))
		}
	}
}
