// Package docscheck holds the checks that keep README.md and docs/ honest:
// their relative links resolve, every guide is reachable from the README,
// the README's Go blocks compile as written, and every Go block of docs/
// is an excerpt of a program that does.
package docscheck

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// markdownFiles are README.md and every page under docs/, as paths from
// the root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md"}
	for _, p := range pages {
		rel, _ := filepath.Rel(root, p)
		files = append(files, rel)
	}
	return files
}

// link is a Markdown link's target: [text](target) or ![alt](target).
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// relativeLinks returns the targets of file's links that point into the
// repository (not http:, https:, mailto: or an anchor of the same page),
// resolved from the root, without their anchors. Links inside fenced code
// blocks are not links.
func relativeLinks(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fenced := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range link.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			out = append(out, filepath.Clean(filepath.Join(filepath.Dir(file), target)))
		}
	}
	return out
}

// TestRelativeLinksResolve: every relative link in README.md, the
// changelog, the contributing guide and docs/ names a file or directory
// of the repository.
func TestRelativeLinksResolve(t *testing.T) {
	for _, file := range markdownFiles(t) {
		for _, target := range relativeLinks(t, file) {
			if _, err := os.Stat(filepath.Join(root, target)); err != nil {
				t.Errorf("%s links to %s, which does not exist", file, target)
			}
		}
	}
}

// TestEveryGuideIsReachable: every page under docs/ can be reached from
// README.md by following links.
func TestEveryGuideIsReachable(t *testing.T) {
	seen := map[string]bool{"README.md": true}
	queue := []string{"README.md"}
	for len(queue) > 0 {
		file := queue[0]
		queue = queue[1:]
		for _, target := range relativeLinks(t, file) {
			if strings.HasSuffix(target, ".md") && !seen[target] {
				seen[target] = true
				queue = append(queue, target)
			}
		}
	}
	for _, file := range markdownFiles(t) {
		if !seen[file] {
			t.Errorf("%s is not reachable from README.md", file)
		}
	}
}

// TestReadmeIsForUsers: the README stays short and speaks to users: no
// test names, no dates, no issue numbers.
func TestReadmeIsForUsers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if n := strings.Count(text, "\n"); n > 250 {
		t.Errorf("README.md has %d lines, want at most 250: move the detail into a guide under docs/", n)
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`\b(Test|Fuzz|Benchmark)[A-Z]\w*`),
		regexp.MustCompile(`\b20\d\d-[01]\d-[0-3]\d\b`),
		regexp.MustCompile(`(?i)\bissue \d+`),
	} {
		if m := bad.FindString(text); m != "" {
			t.Errorf("README.md mentions %q: test names, dates and issue numbers belong to docs/testing.md and git log", m)
		}
	}
}

// goBlock is a fenced Go block of a Markdown file.
var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// TestReadmeGoBlocksCompile: each Go block of the README is a whole
// program (package main, its imports) that builds against this checkout;
// the first, the quick start, prints what the README says, run twice.
// Each is built as if it were a package of this module (go build
// -overlay), so it needs nothing from outside.
func TestReadmeGoBlocksCompile(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlock.FindAllStringSubmatch(string(b), -1)
	if len(blocks) == 0 {
		t.Fatal("README.md has no Go block: the quick start is one")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	replace := map[string]string{}
	var pkgs []string
	for i, m := range blocks {
		if !strings.HasPrefix(m[1], "package main\n") {
			t.Errorf("README.md's Go block %d does not start with package main: a reader cannot run it as written", i+1)
			continue
		}
		src := filepath.Join(dir, "block.go")
		src = strings.TrimSuffix(src, ".go") + string(rune('a'+i)) + ".go"
		if err := os.WriteFile(src, []byte(m[1]), 0o644); err != nil {
			t.Fatal(err)
		}
		pkg := filepath.Join("internal", "docscheck", "readme"+string(rune('a'+i)))
		replace[filepath.Join(abs, pkg, "main.go")] = src
		pkgs = append(pkgs, "./"+filepath.ToSlash(pkg))
	}
	overlay, _ := json.Marshal(map[string]any{"Replace": replace})
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool, slices.Concat([]string{"build", "-overlay", overlayFile, "-o", filepath.Join(dir, "bin") + string(filepath.Separator)}, pkgs)...)
	cmd.Dir = abs
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README.md's Go blocks do not build: %v\n%s", err, out)
	}
	// The quick start prints what the README says: one booking, made once,
	// then, run again, the same booking made by no one.
	quick := exec.Command(filepath.Join(dir, "bin", "readmea"))
	quick.Dir = t.TempDir()
	first, err := quick.Output()
	if err != nil {
		t.Fatalf("the quick start: %v\n%s", err, first)
	}
	again := exec.Command(quick.Path)
	again.Dir = quick.Dir
	second, err := again.Output()
	if err != nil {
		t.Fatalf("the quick start, run again: %v\n%s", err, second)
	}
	want := regexp.MustCompile(`^delivery 1: booking (B-\d+), bookings made: 1\ndelivery 2: booking (B-\d+), bookings made: 1\n$`)
	m := want.FindStringSubmatch(string(first))
	if m == nil || m[1] != m[2] {
		t.Fatalf("the quick start printed %q, not one booking made once", first)
	}
	if string(second) != strings.ReplaceAll(string(first), "made: 1", "made: 0") {
		t.Fatalf("the quick start, run again, printed %q; want the same booking made by no one", second)
	}
}

// goLink is a relative link to a Go file: [text](path.go).
var goLink = regexp.MustCompile(`\]\(([^)\s:]+\.go)\)`)

// TestGuideGoBlocksAreFromPrograms: every Go block under docs/ is an
// excerpt of a program that builds and runs — a runnable example, a
// command of examples/ — named by the last link to a Go file in the
// paragraph before the block. Each line of the block (spaces aside) is a line of that file,
// in the file's order; a line ending in "…" stands for any line that
// starts with what comes before it. The named files are compiled (and
// their examples run) by the module's own tests.
func TestGuideGoBlocksAreFromPrograms(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		name := filepath.Base(page)
		for i := 0; i < len(lines); i++ {
			if strings.TrimSpace(lines[i]) != "```go" {
				continue
			}
			blocks++
			start := i + 1
			var block []string
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
				block = append(block, lines[i])
			}
			prev := start - 2
			for prev >= 0 && strings.TrimSpace(lines[prev]) == "" {
				prev--
			}
			var m []string
			for ; m == nil && prev >= 0 && strings.TrimSpace(lines[prev]) != ""; prev-- {
				if all := goLink.FindAllStringSubmatch(lines[prev], -1); len(all) > 0 {
					m = all[len(all)-1]
				}
			}
			if m == nil {
				t.Errorf("%s:%d: a Go block without a link to the program it comes from in the paragraph before it", name, start)
				continue
			}
			src, err := os.ReadFile(filepath.Join(filepath.Dir(page), m[1]))
			if err != nil {
				t.Errorf("%s:%d: %v", name, start, err)
				continue
			}
			if line, ok := excerptOf(block, strings.Split(string(src), "\n")); !ok {
				t.Errorf("%s:%d: line %q of the block is not in %s (in order)", name, start, line, m[1])
			}
		}
	}
	if blocks == 0 {
		t.Fatal("no Go block under docs/: the check reads nothing")
	}
}

// excerptOf reports whether every non-blank line of block is a line of
// file, in order (see TestGuideGoBlocksAreFromPrograms); if not, it returns
// the first line that is not.
func excerptOf(block, file []string) (string, bool) {
	at := 0
	for _, want := range block {
		want = strings.Join(strings.Fields(want), " ")
		if want == "" {
			continue
		}
		prefix, elided := strings.CutSuffix(want, "…")
		prefix = strings.TrimSpace(prefix)
		found := false
		for ; at < len(file); at++ {
			got := strings.Join(strings.Fields(file[at]), " ")
			if got == want || elided && strings.HasPrefix(got, prefix) {
				found = true
				at++
				break
			}
		}
		if !found {
			return want, false
		}
	}
	return "", true
}

func TestExcerptOf(t *testing.T) {
	file := []string{"a := 1", "\tb := 2 // two", "if err != nil {", "\treturn err", "}"}
	for _, tt := range []struct {
		block []string
		ok    bool
	}{
		{[]string{"a := 1", "", "  b := 2 // two"}, true},
		{[]string{"if err != nil { …", "}"}, true},
		{[]string{"b := 2 // two", "a := 1"}, false}, // out of order
		{[]string{"b := 2"}, false},                  // not the whole line
		{[]string{"a := 1", "a := 1"}, false},        // one line of the file, used once
	} {
		if _, ok := excerptOf(tt.block, file); ok != tt.ok {
			t.Errorf("excerptOf(%q) = %v, want %v", tt.block, ok, tt.ok)
		}
	}
}
