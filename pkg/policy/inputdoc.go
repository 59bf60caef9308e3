package policy

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// inputDoc is one request's policy input before it is an OPA value: what
// the input holds, read from the request once. The decision cache keys on,
// and evaluates a miss with, only the values the policy reads (find); a
// policy that may read anything is evaluated on the whole value (value);
// the decision log writes the document as JSON without building it
// (appendJSON). All three walk one schema, inputSchema, whose leaves are the
// only code that turns the document into values, so they cannot disagree
// about what the input holds. The document refers to the request only
// until its headers are read (most policies never read them); detach reads
// them before the decision log takes the document, which it may read after
// the request has moved on.
type inputDoc struct {
	id, method, host, path, scheme, protocol string
	at                                       time.Time // attributes.request.time, formatted when read: few policies do

	size       int64
	parts      pathParts     // :path, parsed_path and parsed_query terms
	headers    []headerField // sorted by name, one per name (headerList)
	req        *http.Request // until headers are read
	partial    string        // Envoy's x-envoy-auth-partial-body, for headers
	source     *ast.Term     // attributes.source
	dest       *ast.Term     // attributes.destination
	srcPrinc   string        // "" unless the tunnel was authenticated
	dstPrinc   string
	parseBody  bool
	body       string    // http.body; "" leaves it out
	parsedBody *ast.Term // parsed_body when parseBody
	truncated  bool

	headersTerm *ast.Term // built on first use
}

// headerField is one member of attributes.request.http.headers.
type headerField struct {
	name  *ast.Term // lower case
	value string
}

// newInputDoc reads what the input of req holds. A path, query or body
// that cannot be parsed gives a *BadRequestError.
func newInputDoc(req *Request, opts InputOptions) (*inputDoc, error) {
	if req == nil || req.HTTP == nil {
		return nil, errNoHTTPRequest
	}
	r := req.HTTP
	d := &inputDoc{
		id:        req.ID,
		method:    r.Method,
		host:      r.Host,
		path:      requestPath(r),
		scheme:    requestScheme(req),
		protocol:  protocolString(r),
		size:      requestSize(r, req.Body),
		parseBody: opts.ParseBody,
	}
	d.parts = pathTermsFor(d.path)
	if d.parts.err != nil {
		return nil, d.parts.err
	}
	d.at = req.Time
	if d.at.IsZero() {
		d.at = time.Now()
	}
	if id, ok := req.Source.Identity(); ok {
		d.srcPrinc = id.String()
	}
	if !req.Destination.IsZero() {
		d.dstPrinc = req.Destination.String()
	}
	d.source = peerTerms.get(peerKey{addr: req.SourceAddr, principal: d.srcPrinc})
	d.dest = peerTerms.get(peerKey{addr: req.DestAddr, principal: d.dstPrinc})

	var partial string // x-envoy-auth-partial-body, when a body is sent
	if opts.ParseBody {
		d.parsedBody = ast.NullTerm()
		body, truncated := req.Body, req.BodyTruncated
		if len(body) > 0 || truncated {
			if limit := opts.BodyLimit(); len(body) > limit {
				body, truncated = body[:limit], true
			}
			// Envoy tells the authorizer whether the body it forwarded is partial.
			partial = strconv.FormatBool(truncated)
			d.body = sanitizeUTF8(body)
		}
		d.truncated = truncated
		if !truncated && len(body) > 0 {
			v, err := parseBody(r, body)
			if err != nil {
				return nil, err
			}
			if v != nil {
				d.parsedBody = ast.NewTerm(v)
			}
		}
	}
	d.req, d.partial = r, partial
	return d, nil
}

// headerList returns the headers, reading them from the request on first
// use.
func (d *inputDoc) headerList() []headerField {
	if d.req != nil {
		d.headers = headerFields(d.req, d.host, d.path, d.partial)
		d.req = nil
	}
	return d.headers
}

// detach lets go of the request (see inputDoc).
func (d *inputDoc) detach() { d.headerList() }

// headerFields lower-cases header names, adds the pseudo-headers and joins
// repeated values with ",", as Envoy's ext_authz filter does. A client's
// x-envoy-auth-partial-body and x-forwarded-client-cert never get in;
// partial is Envoy's own x-envoy-auth-partial-body ("" for none).
func headerFields(r *http.Request, host, path, partial string) []headerField {
	hs := make([]headerField, 0, len(r.Header)+6)
	if host != "" {
		hs = append(hs, headerField{kPseudoAuthority, host})
	}
	if r.Method != "" {
		hs = append(hs, headerField{kPseudoMethod, r.Method})
	}
	if path != "" {
		hs = append(hs, headerField{kPseudoPath, path})
	}
	if r.Method != http.MethodConnect {
		scheme := "http"
		if r.URL != nil && r.URL.Scheme != "" {
			scheme = r.URL.Scheme
		} else if r.TLS != nil {
			scheme = "https"
		}
		hs = append(hs, headerField{kPseudoScheme, scheme})
	}
	if partial != "" {
		hs = append(hs, headerField{kPartialBody, partial})
	}
	hasTE := false
	for name, values := range r.Header {
		if len(values) == 0 {
			continue
		}
		k := headerKeyTerm(name)
		key := string(k.Value.(ast.String))
		if key == "" || key[0] == ':' || key == headerPartialBody || key == headerXFCC || key == "host" {
			continue
		}
		hasTE = hasTE || key == "transfer-encoding"
		value := values[0]
		if len(values) > 1 {
			value = strings.Join(values, ",")
		}
		hs = append(hs, headerField{k, value})
	}
	// net/http moves Transfer-Encoding out of the header map; Envoy keeps it.
	if len(r.TransferEncoding) > 0 && !hasTE {
		hs = append(hs, headerField{kTransferEnc, strings.Join(r.TransferEncoding, ",")})
	}
	slices.SortFunc(hs, func(a, b headerField) int {
		return cmp.Or(a.name.Value.Compare(b.name.Value), strings.Compare(a.value, b.value))
	})
	// Two spellings of one name (only possible for non-canonical keys)
	// merge like repeated values.
	merged := hs[:0]
	for _, h := range hs {
		if n := len(merged); n > 0 && merged[n-1].name.Value.Compare(h.name.Value) == 0 {
			merged[n-1].value += "," + h.value
			continue
		}
		merged = append(merged, h)
	}
	return merged
}

func (d *inputDoc) headersValue() *ast.Term {
	if d.headersTerm == nil {
		hs := d.headerList()
		obj := ast.NewObjectWithCapacity(len(hs))
		for _, h := range hs {
			v := d.parts.path // :path is http.path
			if h.name != kPseudoPath {
				v = constTerm(h.value) // :method, :scheme and the like recur
			}
			obj.Insert(h.name, v)
		}
		d.headersTerm = ast.NewTerm(obj)
	}
	return d.headersTerm
}

// writeHeaders writes the headers object as headersValue would render.
func (d *inputDoc) writeHeaders(w *jsonWriter, r *redaction) {
	w.b = append(w.b, '{')
	for i, h := range d.headerList() {
		name := string(h.name.Value.(ast.String))
		w.key(i == 0, name)
		if sub := r.member(name); sub != nil && sub.mask {
			w.b = appendJSONString(w.b, Masked)
		} else {
			w.b = appendJSONString(w.b, h.value)
		}
	}
	w.b = append(w.b, '}')
}

// inputField is a member of the input document: an object of fields, or a
// leaf whose value is a string (str) or a term (term); a leaf with ok false
// or a nil term is absent. write, when set, renders a term leaf's JSON
// without building its term.
type inputField struct {
	key    *ast.Term
	fields []inputField
	str    func(*inputDoc) (s string, ok bool)
	term   func(*inputDoc) *ast.Term
	write  func(*inputDoc, *jsonWriter, *redaction)
	// shared marks term leaves whose terms recur across requests (cached
	// peers and parsed paths, constants): the decision log renders each
	// such term once.
	shared bool
}

// inputSchema is the OPA-Envoy (ext_authz v3) input document. Members are
// in key order, the order in which ast objects list them.
var inputSchema = sortedSchema(inputField{fields: []inputField{
	{key: kAttributes, fields: []inputField{
		{key: kSource, term: func(d *inputDoc) *ast.Term { return d.source }, shared: true},
		{key: kDestination, term: func(d *inputDoc) *ast.Term { return d.dest }, shared: true},
		{key: kRequest, fields: []inputField{
			{key: kHTTP, fields: []inputField{
				{key: kID, str: func(d *inputDoc) (string, bool) { return d.id, d.id != "" }},
				{key: kMethod, str: func(d *inputDoc) (string, bool) { return d.method, d.method != "" }},
				{key: kPath, term: func(d *inputDoc) *ast.Term {
					if d.path == "" {
						return nil
					}
					return d.parts.path
				}},
				{key: kHost, str: func(d *inputDoc) (string, bool) { return d.host, d.host != "" }},
				{key: kScheme, str: func(d *inputDoc) (string, bool) { return d.scheme, true }},
				{key: kProtocol, str: func(d *inputDoc) (string, bool) { return d.protocol, d.protocol != "" }},
				{key: kHeaders, term: (*inputDoc).headersValue, write: (*inputDoc).writeHeaders},
				{key: kSize, term: func(d *inputDoc) *ast.Term {
					if d.size == 0 {
						return nil
					}
					return ast.InternedTerm(d.size)
				}},
				{key: kBody, str: func(d *inputDoc) (string, bool) { return d.body, d.body != "" }},
			}},
			{key: kTime, str: func(d *inputDoc) (string, bool) { return protoTimestamp(d.at), true }},
		}},
		{key: kMetadataContext, term: func(*inputDoc) *ast.Term { return emptyObjectTerm }, shared: true},
		{key: kRouteMetadata, term: func(*inputDoc) *ast.Term { return emptyObjectTerm }, shared: true},
	}},
	{key: kParsedPath, term: func(d *inputDoc) *ast.Term { return d.parts.parsedPath }, shared: true},
	{key: kParsedQuery, term: func(d *inputDoc) *ast.Term { return d.parts.parsedQuery }, shared: true},
	{key: kVersion, term: func(*inputDoc) *ast.Term { return versionTerm }, shared: true},
	{key: kParsedBody, term: func(d *inputDoc) *ast.Term { return d.parsedBody }},
	{key: kTruncatedBody, term: func(d *inputDoc) *ast.Term {
		if !d.parseBody {
			return nil
		}
		return ast.InternedTerm(d.truncated)
	}},
	{key: kSourcePrincipal, term: func(d *inputDoc) *ast.Term { return principalTerm(d.srcPrinc) }},
	{key: kDestinationPrincipl, term: func(d *inputDoc) *ast.Term { return principalTerm(d.dstPrinc) }},
}})

func sortedSchema(f inputField) inputField {
	slices.SortFunc(f.fields, func(a, b inputField) int { return a.key.Value.Compare(b.key.Value) })
	for i := range f.fields {
		f.fields[i] = sortedSchema(f.fields[i])
	}
	return f
}

func principalTerm(p string) *ast.Term {
	if p == "" {
		return nil
	}
	return principalTerms.get(p)
}

// build returns the field's value in d, nil when absent. Objects are
// always present.
func (f *inputField) build(d *inputDoc) *ast.Term {
	switch {
	case f.str != nil:
		if s, ok := f.str(d); ok {
			return constTerm(s)
		}
		return nil
	case f.term != nil:
		return f.term(d)
	}
	obj := ast.NewObjectWithCapacity(len(f.fields))
	for i := range f.fields {
		if t := f.fields[i].build(d); t != nil {
			obj.Insert(f.fields[i].key, t)
		}
	}
	return ast.NewTerm(obj)
}

func (f *inputField) child(name ast.Value) *inputField {
	for i := range f.fields {
		if f.fields[i].key.Value.Compare(name) == 0 {
			return &f.fields[i]
		}
	}
	return nil
}

// value is the whole input document.
func (d *inputDoc) value() ast.Value { return inputSchema.build(d).Value }

// find is value().Find(path) without building more than the value at path.
func (d *inputDoc) find(path ast.Ref) (ast.Value, bool) {
	l := resolve(path)
	return d.lookup(&l)
}

// An inputLookup is a path into the input resolved against inputSchema
// once (decision cache paths), so that reading it from a request's
// document does not search the schema step by step.
type inputLookup struct {
	path  ast.Ref     // relative to input
	field *inputField // where the path leaves the schema, or ends in it; nil: nowhere (absent)
	rest  ast.Ref     // path's steps below field, read from its built value
}

func resolve(path ast.Ref) inputLookup {
	f := &inputSchema
	for i, step := range path {
		if f.fields == nil {
			return inputLookup{path: path, field: f, rest: path[i:]}
		}
		if f = f.child(step.Value); f == nil {
			return inputLookup{path: path}
		}
	}
	return inputLookup{path: path, field: f}
}

func resolveAll(paths []ast.Ref) []inputLookup {
	ls := make([]inputLookup, len(paths))
	for i, p := range paths {
		ls[i] = resolve(p)
	}
	return ls
}

func (d *inputDoc) lookup(l *inputLookup) (ast.Value, bool) {
	if l.field == nil {
		return nil, false
	}
	t := l.field.build(d)
	if t == nil {
		return nil, false
	}
	if len(l.rest) == 0 {
		return t.Value, true
	}
	v, err := t.Value.Find(l.rest)
	return v, err == nil
}

func (d *inputDoc) appendKey(b []byte, l *inputLookup) []byte {
	if f := l.field; f != nil && f.str != nil && len(l.rest) == 0 {
		// A string field: its key without making it a term first.
		if s, ok := f.str(d); ok {
			return appendKeyString(b, s)
		}
		return appendKeyValue(b, nil, false)
	}
	v, found := d.lookup(l)
	return appendKeyValue(b, v, found)
}

// appendJSON appends the document as appendJSON(b, d.value(), r) would,
// taking the JSON of shared terms from memo when it is not nil.
func (d *inputDoc) appendJSON(b []byte, r *redaction, memo termJSON) []byte {
	w := jsonWriter{b: b, memo: memo}
	inputSchema.writeJSON(d, &w, r)
	return w.b
}

func (f *inputField) writeJSON(d *inputDoc, w *jsonWriter, r *redaction) {
	masked := r != nil && r.mask
	switch {
	case f.str != nil && !masked:
		s, _ := f.str(d)
		w.b = appendJSONString(w.b, s)
		return
	case f.write != nil && !masked:
		f.write(d, w, r)
		return
	case f.fields == nil:
		t := f.build(d)
		if f.shared && r == nil && w.memo != nil {
			w.b = w.memo.append(w.b, t)
			return
		}
		w.value(t.Value, r)
		return
	}
	w.b = append(w.b, '{')
	n := 0
	for i := range f.fields {
		c := &f.fields[i]
		if !c.present(d) {
			continue
		}
		name := string(c.key.Value.(ast.String))
		w.key(n == 0, name)
		n++
		c.writeJSON(d, w, r.member(name))
	}
	w.b = append(w.b, '}')
}

func (f *inputField) present(d *inputDoc) bool {
	switch {
	case f.str != nil:
		_, ok := f.str(d)
		return ok
	case f.write != nil:
		return true
	case f.term != nil:
		return f.term(d) != nil
	}
	return true
}
