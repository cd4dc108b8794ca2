package edi_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemgo/idem/edi"
)

// TestRealInterchanges reads the 60 interchanges other EDI projects use as
// fixtures (testdata/edi-real, sources and licences in its SOURCES.md). A
// file its source marks valid reads without an error; one marked invalid
// gets at least one (a problem in an interchange, or a read error); the
// others (marked null) must at least not panic.
func TestRealInterchanges(t *testing.T) {
	dir := filepath.Join("testdata", "edi-real")
	valid := corpusVerdicts(t, filepath.Join(dir, "SOURCES.md"))
	if len(valid) != 60 {
		t.Fatalf("SOURCES.md lists %d files, want 60", len(valid))
	}
	for file, verdict := range valid {
		t.Run(file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				t.Fatal(err)
			}
			ics, err := edi.ReadAll(data)
			var problems []string
			if err != nil {
				problems = append(problems, err.Error())
			}
			for _, ic := range ics {
				for _, e := range ic.Errors {
					problems = append(problems, e.Error())
				}
			}
			switch verdict {
			case "true":
				if len(problems) > 0 || len(ics) == 0 {
					t.Fatalf("a valid file: %d interchanges, problems %q", len(ics), problems)
				}
			case "false":
				if len(problems) == 0 {
					t.Fatalf("an invalid file read without a problem (%d interchanges)", len(ics))
				}
			}
		})
	}
}

// corpusVerdicts reads the file → valid column of SOURCES.md.
func corpusVerdicts(t *testing.T, path string) map[string]string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cols := strings.Split(sc.Text(), "|")
		if len(cols) < 10 || !strings.HasPrefix(strings.TrimSpace(cols[2]), "`") {
			continue
		}
		out[strings.Trim(strings.TrimSpace(cols[2]), "`")] = strings.TrimSpace(cols[8])
	}
	return out
}
