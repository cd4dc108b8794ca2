package httpidem

import (
	"bytes"
	"io"
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
	advertise  *middleware // sets the final header's expiry, once, before it goes out
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
	if w.advertise != nil {
		w.advertise.advertiseExpiry(code, w.ResponseWriter.Header())
	}
	w.header = w.ResponseWriter.Header().Clone()
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.keeps(len(b)) {
		w.body.Write(b)
	}
	if !w.gone {
		if _, err := w.ResponseWriter.Write(b); err != nil {
			w.gone = true
		}
	}
	return len(b), nil
}

// WriteString is Write of a string, passed on as a string to a writer
// that takes one (io.StringWriter).
func (w *recorder) WriteString(s string) (int, error) {
	if w.keeps(len(s)) {
		w.body.WriteString(s)
	}
	if !w.gone {
		if _, err := io.WriteString(w.ResponseWriter, s); err != nil {
			w.gone = true
		}
	}
	return len(s), nil
}

// keeps sends the header if it is not sent yet, and reports whether the
// copy to store takes n bytes more (else the copy is dropped: too large).
func (w *recorder) keeps(n int) bool {
	if !w.wroteFinal {
		w.WriteHeader(http.StatusOK)
	}
	if w.overflow {
		return false
	}
	if w.body.Len()+n > w.limit {
		w.overflow = true
		w.body = bytes.Buffer{}
		return false
	}
	return true
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
