package as2

import (
	"bufio"
	"bytes"
	"crypto"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/quotedprintable"
	"net/textproto"
	"strings"
)

// entity builds a MIME entity: the header lines (CRLF-terminated, in the
// order given) and the body, unchanged (binary transfer encoding).
func entity(contentType string, body []byte, extra ...string) []byte {
	var b bytes.Buffer
	b.WriteString("Content-Type: " + contentType + "\r\n")
	for i := 0; i+1 < len(extra); i += 2 {
		b.WriteString(extra[i] + ": " + extra[i+1] + "\r\n")
	}
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

// splitEntity separates a MIME entity's header from its body; the header
// ends at the first empty line (CRLF or LF).
func splitEntity(raw []byte) (textproto.MIMEHeader, []byte, error) {
	r := textproto.NewReader(bufio.NewReader(bytes.NewReader(raw)))
	h, err := r.ReadMIMEHeader()
	if err != nil && !(errors.Is(err, io.EOF) && len(h) > 0) {
		return nil, nil, fmt.Errorf("as2: a MIME header: %w", err)
	}
	i := bytes.Index(raw, []byte("\r\n\r\n"))
	j := bytes.Index(raw, []byte("\n\n"))
	switch {
	case i >= 0 && (j < 0 || i < j):
		return h, raw[i+4:], nil
	case j >= 0:
		return h, raw[j+2:], nil
	}
	return h, nil, nil
}

// decodeBody undoes a Content-Transfer-Encoding: binary, 7bit, 8bit,
// base64 (lines of any length, whitespace ignored) or quoted-printable.
func decodeBody(h textproto.MIMEHeader, body []byte) ([]byte, error) {
	switch enc := strings.ToLower(strings.TrimSpace(h.Get("Content-Transfer-Encoding"))); enc {
	case "", "binary", "7bit", "8bit":
		return body, nil
	case "base64":
		clean := bytes.Map(func(r rune) rune {
			if r == '\r' || r == '\n' || r == ' ' || r == '\t' {
				return -1
			}
			return r
		}, body)
		out := make([]byte, base64.StdEncoding.DecodedLen(len(clean)))
		n, err := base64.StdEncoding.Decode(out, clean)
		if err != nil {
			return nil, fmt.Errorf("as2: a base64 body: %w", err)
		}
		return out[:n], nil
	case "quoted-printable":
		out, err := io.ReadAll(quotedprintable.NewReader(bytes.NewReader(body)))
		if err != nil {
			return nil, fmt.Errorf("as2: a quoted-printable body: %w", err)
		}
		return out, nil
	default:
		return nil, fmt.Errorf("as2: unknown Content-Transfer-Encoding %q", enc)
	}
}

// splitMultipart returns the raw parts (header and body, exactly as sent)
// of a multipart body: a delimiter is CRLF (or LF) "--" boundary, and the
// line break before it belongs to it (RFC 2046 §5.1.1). A body of more
// than maxParts parts is an error, found at the part past the bound: a
// body of millions of empty parts costs no more than one of maxParts.
func splitMultipart(body []byte, boundary string, maxParts int) ([][]byte, error) {
	if boundary == "" {
		return nil, errors.New("as2: a multipart body without a boundary")
	}
	delim := []byte("--" + boundary)
	// The first delimiter may open the body.
	start := -1
	if bytes.HasPrefix(body, delim) {
		start = len(delim)
	} else if i := bytes.Index(body, append([]byte("\n"), delim...)); i >= 0 {
		start = i + 1 + len(delim)
	}
	if start < 0 {
		return nil, fmt.Errorf("as2: no delimiter --%s in the multipart body", boundary)
	}
	var parts [][]byte
	for {
		// The rest of the delimiter line: "--" ends the body; else skip
		// transport padding to the line end.
		rest := body[start:]
		if bytes.HasPrefix(rest, []byte("--")) {
			return parts, nil
		}
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			return nil, errors.New("as2: a multipart delimiter line without its line end")
		}
		partStart := start + nl + 1
		next := bytes.Index(body[partStart:], append([]byte("\n"), delim...))
		if next < 0 {
			return nil, errors.New("as2: a multipart body without its closing delimiter")
		}
		end := partStart + next
		if end > partStart && body[end-1] == '\r' {
			end--
		}
		if next == 0 { // an empty part right after the delimiter line
			end = partStart
		}
		if len(parts) == maxParts {
			return nil, fmt.Errorf("as2: a multipart body of more than %d parts", maxParts)
		}
		parts = append(parts, body[partStart:end])
		start = partStart + next + 1 + len(delim)
	}
}

// mediaType parses a Content-Type value.
func mediaType(v string) (string, map[string]string, error) {
	if v == "" {
		return "", nil, errors.New("as2: no Content-Type")
	}
	mt, params, err := mime.ParseMediaType(v)
	if err != nil {
		return "", nil, fmt.Errorf("as2: Content-Type %q: %w", v, err)
	}
	return mt, params, nil
}

// mic is the base64 digest of data with h, as Received-Content-MIC carries
// it.
func mic(data []byte, h crypto.Hash) string {
	d := h.New()
	d.Write(data)
	return base64.StdEncoding.EncodeToString(d.Sum(nil))
}

// base64Lines encodes b in base64 lines of 76 characters, CRLF-ended.
func base64Lines(b []byte) []byte {
	enc := base64.StdEncoding.EncodeToString(b)
	var out bytes.Buffer
	for len(enc) > 76 {
		out.WriteString(enc[:76] + "\r\n")
		enc = enc[76:]
	}
	out.WriteString(enc + "\r\n")
	return out.Bytes()
}
