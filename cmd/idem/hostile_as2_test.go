package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAS2ServeKeepsNothingOfStrangers: with the README's two-partner set-up
// (BUYER signs and encrypts), a plain POST claiming to be BUYER gets an
// insufficient-message-security MDN and writes nothing, neither to --dir
// nor to the rejected directory; two 8 MiB junk bodies from no partner are
// answered 403 and not kept; a --rejected-dir inside --dir is refused at
// start.
func TestAS2ServeKeepsNothingOfStrangers(t *testing.T) {
	w := newAS2World(t)
	inbox, rejected := w.path("inbox"), w.path("inbox.rejected")
	profile := w.profile("SUPPLIER", "BUYER", "http://127.0.0.1:1/as2", as2SyncAgreement, "")
	serve := startAS2Serve(t, "--as2", profile, "--store", "sqlite:"+w.path("supplier.db"), "--dir", inbox)
	post := func(from string, body []byte) (int, []byte) {
		req, _ := http.NewRequest(http.MethodPost, serve+"/as2", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/edi-x12")
		req.Header.Set("Message-ID", "<curl-1@"+from+">")
		req.Header.Set("AS2-From", from)
		req.Header.Set("AS2-To", "SUPPLIER")
		req.Header.Set("Disposition-Notification-To", "ops@"+from)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, answer
	}
	if status, answer := post("BUYER", []byte(as2Interchange)); status != http.StatusOK || !bytes.Contains(answer, []byte("processed/error: insufficient-message-security")) {
		t.Fatalf("a plain message as BUYER: %d %s", status, answer)
	}
	junk := bytes.Repeat([]byte("j"), 8<<20)
	for range 2 {
		if status, _ := post("NOBODY", junk); status != http.StatusForbidden {
			t.Fatalf("junk from no partner: %d", status)
		}
	}
	for _, dir := range []string{inbox, rejected} {
		if files, _ := os.ReadDir(dir); len(files) != 0 {
			t.Fatalf("%s holds %d files", dir, len(files))
		}
	}
	cmd := exec.Command(os.Args[0], "as2", "serve", "--listen", "127.0.0.1:0", "--as2", profile, "--store", "sqlite:"+w.path("other.db"),
		"--dir", inbox, "--rejected-dir", inbox+"/rejected")
	cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "inside --dir") {
		t.Fatalf("a rejected directory inside the delivery directory: %v %s", err, out)
	}
}

// TestRejectedDirIsBounded: the rejected directory takes messages up to its
// file and byte bounds, then refuses (the receiver answers 503 and the
// partner sends again) rather than fill the disk.
func TestRejectedDirIsBounded(t *testing.T) {
	b := &boundedDir{dir: t.TempDir(), maxFiles: 2, maxBytes: 100}
	if err := b.write("a", ".as2", make([]byte, 40)); err != nil {
		t.Fatal(err)
	}
	if err := b.write("b", ".as2", make([]byte, 70)); err == nil {
		t.Fatal("110 bytes kept under a bound of 100")
	}
	if err := b.write("c", ".as2", make([]byte, 40)); err != nil {
		t.Fatal(err)
	}
	if err := b.write("d", ".as2", nil); err == nil {
		t.Fatal("a third file kept under a bound of 2")
	}
}
