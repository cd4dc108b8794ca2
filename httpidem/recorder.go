package httpidem

import (
	"bytes"
	"net/http"
)

// recorder passes the response through to the client as the handler writes
// it (streaming keeps working) and keeps a copy, up to limit bytes, to store.
// Once the client is gone (a write to it failed), the rest of the response
// is still recorded and the handler sees no error: a proxy keeps reading its
// upstream to the end instead of aborting, and the whole answer is stored for
// the client's retry.
type recorder struct {
	http.ResponseWriter
	limit      int
	onHeader   func(status int, h http.Header) // called once, before the final header goes out
	status     int
	header     http.Header // snapshot at WriteHeader
	body       bytes.Buffer
	overflow   bool
	wroteFinal bool
	gone       bool // the client connection failed a write
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *recorder) WriteHeader(code int) {
	if w.wroteFinal {
		return
	}
	if code >= 100 && code < 200 {
		w.ResponseWriter.WriteHeader(code) // informational: not the response
		return
	}
	w.wroteFinal = true
	w.status = code
	if w.onHeader != nil {
		w.onHeader(code, w.ResponseWriter.Header())
	}
	w.header = w.ResponseWriter.Header().Clone()
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if !w.wroteFinal {
		w.WriteHeader(http.StatusOK)
	}
	if !w.overflow {
		if w.body.Len()+len(b) > w.limit {
			w.overflow = true
			w.body = bytes.Buffer{}
		} else {
			w.body.Write(b)
		}
	}
	if w.gone {
		return len(b), nil
	}
	if _, err := w.ResponseWriter.Write(b); err != nil {
		w.gone = true
	}
	return len(b), nil
}

// Flush supports handlers that assert http.Flusher directly.
func (w *recorder) Flush() {
	if !w.wroteFinal {
		w.WriteHeader(http.StatusOK)
	}
	if !w.gone {
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}
