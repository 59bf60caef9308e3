package l7

import (
	"maps"
	"net/http"

	"github.com/causeway-mesh/causeway/pkg/l7/h1"
)

// What one request is observed by: the record the access log and metrics
// are made from, and the writer that notes what the caller was sent.

// record is what the access log and the metrics say about one request.
type record struct {
	listener  string // an ingress gateway's listener that served the request
	route     string
	rule      string
	backend   string
	endpoint  string
	ep        *endpoint // the endpoint of endpoint, nil when none was chosen
	decision  string    // allow, deny, or "" when no decision was needed
	reason    string
	decID     string
	attempts  int
	grpcCode  int // gRPC status of a gRPC request's reply (local or upstream), -1 when none
	localCode int // status the engine chose for a local reply (a gRPC one is sent as 200)
}

// responseRecorder notes the status and size of what the client is sent.
// It exposes the underlying writer through Unwrap, so flushing, hijacking
// (upgrades) and read deadlines work through http.ResponseController.
type responseRecorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *responseRecorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	} else if code == http.StatusSwitchingProtocols {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseRecorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *responseRecorder) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *responseRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// takeHeader makes h, an upstream response's header used no further, the
// response's: taken as it is when the writer has none yet and can (the
// HTTP/1.1 server's), copied otherwise. It returns the response's header.
func (w *responseRecorder) takeHeader(h http.Header) http.Header {
	if t, ok := w.ResponseWriter.(*h1.ResponseWriter); ok && t.TakeHeader(h) {
		return h
	}
	dst := w.Header()
	maps.Copy(dst, h)
	return dst
}

// canWriteRaw reports whether writeRaw may work: the response goes to the
// HTTP/1.1 server's writer, which has no header yet.
func (w *responseRecorder) canWriteRaw() bool {
	h, ok := w.ResponseWriter.(*h1.ResponseWriter)
	return ok && h.CanWriteRaw()
}

// writeRaw writes the head of a response with Content-Length cl and the
// fields raw as they are, if the writer can (see h1.ResponseWriter.WriteRaw).
func (w *responseRecorder) writeRaw(code int, cl int64, raw *h1.RawFields) bool {
	h, ok := w.ResponseWriter.(*h1.ResponseWriter)
	if !ok || !h.WriteRaw(code, cl, raw) {
		return false
	}
	w.status = code
	return true
}
