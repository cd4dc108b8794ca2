package databasesql

import (
	"context"
	"fmt"
	"strings"

	"github.com/idemgo/idem/sqldriver"
)

// mysqlExecutor runs statements written with $n placeholders on MySQL.
type mysqlExecutor struct{ e executor }

func (m mysqlExecutor) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	if len(args) == 0 {
		if stmts := splitStatements(query); len(stmts) > 1 {
			var n int64
			for _, st := range stmts {
				k, err := m.e.Exec(ctx, st)
				if err != nil {
					return n, err
				}
				n += k
			}
			return n, nil
		}
	}
	q, a, err := rebind(query, args)
	if err != nil {
		return 0, err
	}
	return m.e.Exec(ctx, q, a...)
}

func (m mysqlExecutor) Query(ctx context.Context, query string, args ...any) (sqldriver.Rows, error) {
	q, a, err := rebind(query, args)
	if err != nil {
		return nil, err
	}
	return m.e.Query(ctx, q, a...)
}

func (m mysqlExecutor) QueryRow(ctx context.Context, query string, args ...any) sqldriver.Row {
	q, a, err := rebind(query, args)
	if err != nil {
		return errRow{err}
	}
	return m.e.QueryRow(ctx, q, a...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// rebind turns the $1, $2, … placeholders of query into MySQL's ?, each
// with its argument: repeated where a placeholder is, in the order they
// appear. Quoted strings, quoted identifiers and comments are left alone.
func rebind(query string, args []any) (string, []any, error) {
	if !strings.Contains(query, "$") {
		return query, args, nil
	}
	var b strings.Builder
	b.Grow(len(query))
	out := make([]any, 0, len(args))
	err := scan(query, func(code string) error {
		for {
			i := strings.IndexByte(code, '$')
			if i < 0 || i+1 >= len(code) || code[i+1] < '0' || code[i+1] > '9' {
				b.WriteString(code)
				return nil
			}
			j := i + 1
			n := 0
			for j < len(code) && code[j] >= '0' && code[j] <= '9' {
				n = n*10 + int(code[j]-'0')
				j++
			}
			if n < 1 || n > len(args) {
				return fmt.Errorf("idem/databasesql: placeholder $%d with %d arguments", n, len(args))
			}
			b.WriteString(code[:i])
			b.WriteByte('?')
			out = append(out, args[n-1])
			code = code[j:]
		}
	}, func(quoted string) { b.WriteString(quoted) })
	return b.String(), out, err
}

// splitStatements splits query at the semicolons that end its statements
// (none inside quotes or comments), dropping empty ones.
func splitStatements(query string) []string {
	var stmts []string
	var cur strings.Builder
	flush := func() {
		if st := strings.TrimSpace(cur.String()); st != "" {
			stmts = append(stmts, st)
		}
		cur.Reset()
	}
	_ = scan(query, func(code string) error {
		for {
			i := strings.IndexByte(code, ';')
			if i < 0 {
				cur.WriteString(code)
				return nil
			}
			cur.WriteString(code[:i])
			flush()
			code = code[i+1:]
		}
	}, func(quoted string) { cur.WriteString(quoted) })
	flush()
	return stmts
}

// scan walks query, handing its code to code and its quoted strings,
// quoted identifiers and comments — each whole — to quoted.
func scan(query string, code func(string) error, quoted func(string)) error {
	for len(query) > 0 {
		i := strings.IndexAny(query, "'\"`-/#")
		if i < 0 {
			return code(query)
		}
		end := -1
		switch c := query[i]; {
		case c == '\'' || c == '"' || c == '`':
			end = closeQuote(query, i)
		case c == '#':
			end = lineEnd(query, i)
		case c == '-' && strings.HasPrefix(query[i:], "-- "), c == '-' && strings.HasPrefix(query[i:], "--\n"):
			end = lineEnd(query, i)
		case c == '/' && strings.HasPrefix(query[i:], "/*"):
			if k := strings.Index(query[i+2:], "*/"); k >= 0 {
				end = i + 2 + k + 2
			} else {
				end = len(query)
			}
		}
		if end < 0 { // a lone - or /: code
			if err := code(query[:i+1]); err != nil {
				return err
			}
			query = query[i+1:]
			continue
		}
		if err := code(query[:i]); err != nil {
			return err
		}
		quoted(query[i:end])
		query = query[end:]
	}
	return nil
}

// closeQuote is the index after the quote closing the one at i (a doubled
// quote, or a backslash before one, stays inside), or len(s).
func closeQuote(s string, i int) int {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if q != '`' {
				j++
			}
		case q:
			if j+1 < len(s) && s[j+1] == q {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(s)
}

func lineEnd(s string, i int) int {
	if k := strings.IndexByte(s[i:], '\n'); k >= 0 {
		return i + k + 1
	}
	return len(s)
}
