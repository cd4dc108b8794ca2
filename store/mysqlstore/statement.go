package mysqlstore

import (
	"fmt"
	"strings"
)

// params are the values a statement's :name parameters take.
type params struct {
	key, fp, result                       []byte
	now, lease, keep, fence, floor, limit int64
	state, max                            int
}

// statement is SQL whose :name parameters became ?, and their names in
// order.
type statement struct {
	text  string
	names []string
}

// stmt compiles sql written with :name parameters.
func stmt(sql string) statement {
	var b strings.Builder
	var names []string
	for {
		i := strings.IndexByte(sql, ':')
		if i < 0 {
			b.WriteString(sql)
			break
		}
		j := i + 1
		for j < len(sql) && (sql[j] >= 'a' && sql[j] <= 'z') {
			j++
		}
		name := sql[i+1 : j]
		b.WriteString(sql[:i])
		b.WriteByte('?')
		names = append(names, name)
		param(&params{}, name) // panics at init on a name params lacks
		sql = sql[j:]
	}
	return statement{text: b.String(), names: names}
}

// bind returns the arguments of the statement's placeholders.
func (st statement) bind(p *params) []any {
	args := make([]any, len(st.names))
	for i, n := range st.names {
		args[i] = param(p, n)
	}
	return args
}

func param(p *params, name string) any {
	switch name {
	case "key":
		return p.key
	case "fp":
		return p.fp
	case "result":
		return p.result
	case "now":
		return p.now
	case "lease":
		return p.lease
	case "keep":
		return p.keep
	case "fence":
		return p.fence
	case "floor":
		return p.floor
	case "limit":
		return p.limit
	case "state":
		return p.state
	case "max":
		return p.max
	}
	panic(fmt.Sprintf("mysqlstore: statement parameter :%s", name))
}
