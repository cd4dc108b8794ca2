package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/idemgo/idem/internal/storedresp"
)

// resultSummary shows a record's result in a table cell: a stored HTTP
// response as its status and a body preview, anything else as preview.
func resultSummary(b []byte) string {
	if status, _, body, err := storedresp.Decode(b); err == nil {
		s := fmt.Sprintf("%d %s", status, http.StatusText(status))
		if body := preview(body); body != "" {
			s += " · " + body
		}
		return s
	}
	return preview(b)
}

// resultDetail shows a record's result in full (its body up to 4,000
// characters): a stored HTTP response as its status line, its headers and
// its body, a JSON body pretty-printed.
func resultDetail(b []byte) string {
	status, header, body, err := storedresp.Decode(b)
	if err != nil {
		return bodyText(b)
	}
	var s strings.Builder
	fmt.Fprintf(&s, "HTTP %d %s\n", status, http.StatusText(status))
	names := make([]string, 0, len(header))
	for name := range header {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, v := range header[name] {
			fmt.Fprintf(&s, "%s: %s\n", name, v)
		}
	}
	if len(body) > 0 {
		s.WriteString("\n" + bodyText(body))
	}
	return s.String()
}

// bodyText is b as text: JSON pretty-printed, text as it is, binary as its
// size; at most 4,000 characters.
func bodyText(b []byte) string {
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes of binary)", len(b))
	}
	var out bytes.Buffer
	if json.Valid(b) && json.Indent(&out, b, "", "  ") == nil {
		b = out.Bytes()
	}
	if len(b) > 4000 {
		return string(b[:4000]) + "…"
	}
	return string(b)
}

// missingTable finds the table a SQL error says is not there (SQLite's "no
// such table: T", PostgreSQL's relation "T" does not exist).
var missingTable = regexp.MustCompile(`no such table: ([A-Za-z0-9_."]+)|relation "([^"]+)" does not exist`)

// describe is err as an operator should read it: a table that is not in
// the database is named with what creates it.
func (c *Console) describe(err error) string {
	m := missingTable.FindStringSubmatch(err.Error())
	if m == nil {
		return err.Error()
	}
	table := m[1] + m[2]
	store := "URL"
	if c.cfg.StoreURL != "" {
		store = c.cfg.StoreURL
	}
	base := table[strings.LastIndexByte(table, '.')+1:]
	if strings.HasPrefix(base, "idem_") {
		return fmt.Sprintf("No %s table in this database: run idem migrate --store %s to create it.", table, store)
	}
	return fmt.Sprintf("No %s table in this database: the transactional inbox creates it (inbox.Migrate) when its first consumer starts.", table)
}
