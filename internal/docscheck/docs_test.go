// Package docscheck holds the checks that keep README.md and docs/ honest:
// their relative links resolve, every guide is reachable from the README,
// and the README's Go blocks compile as written.
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
