package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// startNPMServer starts the executable an npm package installs (in
// $XDG_CACHE_HOME/idem-npm, where .ci/run puts it, or where the
// environment variable binEnv says) on a free loopback port, with the
// arguments and environment args gives for the port, and returns its
// endpoint, http://127.0.0.1:PORT (args says what to run for the
// executable and the port: the executable itself, or node around it). It is killed when this process ends,
// also by SIGKILL. It sets, where they are not set, a region and
// credentials for the AWS configuration (an emulator takes any).
func startNPMServer(t testing.TB, name, binEnv string, args func(bin string, port int) (exe string, argv, env []string)) (string, error) {
	bin, err := npmBin(name, binEnv)
	if err != nil {
		return "", err
	}
	var endpoint string
	var startErr error
	startOnFreePorts(t, name, func(int) error {
		port := freePort(t)
		log := filepath.Join(os.TempDir(), "idem-"+name+"-"+strconv.Itoa(port)+".log")
		out, err := os.Create(log)
		if err != nil {
			return err
		}
		defer out.Close()
		exe, argv, env := args(bin, port)
		cmd := exec.Command(exe, argv...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = out, out
		s, err := startServer(cmd, log, "")
		if err != nil {
			startErr = err
			return nil
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if err := s.waitReady(30*time.Second, func() error { return listening(addr) }); err != nil {
			return err
		}
		endpoint = "http://" + addr
		return nil
	})
	if startErr != nil {
		return "", startErr
	}
	setEmulatorCredentials()
	return endpoint, nil
}

// npmBin returns the executable the npm package name installs: where
// binEnv says, else in $XDG_CACHE_HOME/idem-npm, where .ci/run puts it.
func npmBin(name, binEnv string) (string, error) {
	bin := os.Getenv(binEnv)
	if bin == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		bin = filepath.Join(cache, "idem-npm", "node_modules", ".bin", name)
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no %s (npm i %s in $XDG_CACHE_HOME/idem-npm, or set %s): %w", name, name, binEnv, err)
	}
	return bin, nil
}

// setEmulatorCredentials sets, where they are not set, a region and
// credentials for the AWS configuration: an emulator takes any.
func setEmulatorCredentials() {
	for k, v := range map[string]string{"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "idem", "AWS_SECRET_ACCESS_KEY": "idem"} {
		if os.Getenv(k) == "" {
			os.Setenv(k, v)
		}
	}
}
