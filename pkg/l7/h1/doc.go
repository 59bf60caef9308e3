// Package h1 is the waypoint's HTTP/1.1 wire layer, below the engine in
// pkg/l7: what reads and writes HTTP/1.1 bytes, and nothing that routes,
// authorizes or chooses an endpoint.
//
//   - Serve is the server for one tunnel (h1server.go): requests parsed by
//     net/http's parser or, when their head is plain, by plainRequest
//     (h1head.go), and checked as net/http's server checks them; response
//     framing, keep-alive, 100-continue, trailers, hijack and timeouts are
//     its own. ResponseWriter can also pass an upstream response's field
//     lines on as they came (WriteRaw, with RawFields).
//   - A Drainer ends the connections Serve serves as a stopping server
//     should (RFC 9112 §9.6): idle ones closed at once, busy ones after a
//     response that says Connection: close.
//   - Each request's context comes from a scope per connection (reqctx.go)
//     rather than context.WithCancel, and ends when the client goes away:
//     a PeerDoner (an HBONE stream, or an AheadConn around any other
//     connection) reports that without a read kept pending.
//   - Client sends replayable bodyless requests (Inlinable) over keep-alive
//     connections in the caller's goroutine (inlineh1.go), never reusing a
//     connection that received anything while idle (idleprobe_*.go).
//   - Fields is a request header as a list, the form the engine's header
//     rules work on and Client writes as it is; the hop-by-hop rules of
//     RFC 9110 section 7.6.1 are here too.
//
// Differential fuzz targets hold each fast path to net/http: FuzzServeH1
// (the server), FuzzPlainHead (the head parser), FuzzWriteHead (the
// request head Client writes), FuzzWriteRaw (raw response fields) and
// FuzzFieldList. ../DESIGN-NOTE.md has the measurements behind it.
package h1
