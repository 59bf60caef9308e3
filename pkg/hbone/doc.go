// Package hbone carries TCP over HBONE: HTTP/2 CONNECT over mutual TLS 1.3,
// wire-compatible with Istio's ztunnel (docs/design.md §4).
//
// Server side: a Server accepts TLS connections (trust.ServerConfig), serves
// HTTP/2 on each and hands every CONNECT to a Handler together with the peer
// proven by the TLS handshake (authenticated identity or unauthenticated,
// never anything taken from headers). The Handler answers with a Stream
// (200) or an error (Deny: 401, Unavailable: 503, BadRequest: 400); other
// methods get 405, malformed authorities 400, each with its reason as a
// text body. Requests that break RFC 9113 (pseudo-header fields,
// connection-specific fields, content-length against DATA) are reset with
// PROTOCOL_ERROR and never reach the Handler, and frames arriving in the
// wrong stream state get the error RFC 9113 §5.1 names.
//
// Client side: a Pool dials tunnels over pooled HTTP/2 connections keyed by
// {source identity, expected server identities, next hop}, at most
// MaxStreamsPerConn (or the server's limit) tunnels per connection, one dial
// at a time per key, and drops connections that went idle, received GOAWAY
// or missed a PING, or whose bytes went unacknowledged as long (a peer
// that vanished: TCP_USER_TIMEOUT, usertimeout_linux.go).
//
// Tunnels on both sides are net.Conns with CloseWrite: it sends END_STREAM
// while the other direction keeps flowing, and Read returns io.EOF when the
// peer did the same. Join and Splice copy between a tunnel and a TCP
// connection, propagating half-close both ways; Relay (relay.go) does so
// without a goroutine while the pair is idle, its sockets waiting in one
// epoll instance for the process (poller_linux.go).
//
// The HTTP/2 layer is built on golang.org/x/net/http2's Framer and hpack
// (see conn.go for why not on http2.Server/Transport); header blocks are
// read by the package itself, bounded in frames, bytes and time
// (headers.go). Windows default to
// 4 MiB per stream and 16 MiB per connection; received data sits in pooled
// chunks only until it is read, and copies into a tunnel take a buffer only
// once the source is readable, so an idle tunnel holds no buffer.
package hbone
