package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/idemgo/idem/store/pgstore"
	"github.com/idemgo/idem/store/redisstore"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchscripts pgbench SCHEMA | pgbench-batch SCHEMA | redis-acquire | redis-owned | redis-library | redis-function acquire|settle")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "pgbench":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: benchscripts pgbench SCHEMA")
			os.Exit(2)
		}
		acquire, settle := pgstore.Statements(os.Args[2])
		// Keys and fingerprints as a table of the packed layout keeps
		// them (keypack: a key other than a compact one as 0 and its bytes).
		key := `('\x00'::bytea || convert_to('pgb-' || :n, 'UTF8'))`
		acquire = strings.NewReplacer("$1", key, "$2", "'bench'", "$3", "60000", "$4", "3600000", "$5", "0").Replace(acquire)
		settle = strings.NewReplacer("$1", key, "$2", ":fence", "$3", "3600000", "$4", "2", "$5", `convert_to('{"status":"ok"}', 'UTF8')`).Replace(settle)
		fmt.Printf("\\set n random(1, 1000000000000)\n%s \\gset\n%s;\n", oneLine(acquire), oneLine(settle))
	case "pgbench-batch":
		// A lifecycle of 16 keys: one coalesced acquire, one coalesced settle.
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: benchscripts pgbench-batch SCHEMA")
			os.Exit(2)
		}
		acquire, settle := pgstore.BatchStatements(os.Args[2])
		keys := `ARRAY(SELECT '\x00'::bytea || convert_to('pgb-' || (:n::int8 * 100 + g), 'UTF8') FROM generate_series(1, 16) g ORDER BY 1)`
		acquire = strings.NewReplacer("$1::bytea[]", keys, "$2::bytea[]", "array_fill('bench'::bytea, ARRAY[16])",
			"$3", "60000", "$4", "3600000", "$5", "0").Replace(acquire)
		settle = strings.NewReplacer("$1::bytea[]", keys, "$2::int8[]", ":fences::int8[]",
			"$3::float8[]", "array_fill(3600000::float8, ARRAY[16])", "$4::int2[]", "array_fill(2::int2, ARRAY[16])",
			"$5::bytea[]", `array_fill(convert_to('{"status":"ok"}', 'UTF8'), ARRAY[16])`).Replace(settle)
		fmt.Printf("\\set n random(1, 10000000000)\nWITH a AS (%s) SELECT array_agg(fence ORDER BY k)::text AS fences FROM a \\gset\n%s;\n",
			oneLine(acquire), oneLine(settle))
	case "redis-acquire":
		fmt.Print(redisstore.AcquireScript())
	case "redis-owned":
		fmt.Print(redisstore.OwnedScript())
	case "redis-library":
		source, _, _ := redisstore.FunctionLibrary()
		fmt.Print(source)
	case "redis-function":
		_, acquire, settle := redisstore.FunctionLibrary()
		switch {
		case len(os.Args) == 3 && os.Args[2] == "acquire":
			fmt.Println(acquire)
		case len(os.Args) == 3 && os.Args[2] == "settle":
			fmt.Println(settle)
		default:
			fmt.Fprintln(os.Stderr, "usage: benchscripts redis-function acquire|settle")
			os.Exit(2)
		}
	default:
		fmt.Fprintf(os.Stderr, "benchscripts: unknown script %q\n", os.Args[1])
		os.Exit(2)
	}
}

// oneLine joins a statement's lines: pgbench reads one command per line
// unless the line ends with a backslash.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
