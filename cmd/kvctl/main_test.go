package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"synod/kv/local"
	"synod/kv/server"
	"synod/kv/sm"
	"synod/tenants"
)

const testToken = "kvctl-test-token"

func startStore(t *testing.T) string {
	t.Helper()
	s, err := sm.Open(t.TempDir(), sm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	reg, _ := tenants.NewRegistry([]tenants.Spec{{ID: 1, Name: "t", Token: testToken}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{}, reg, local.New(s, ln.Addr().String()), zerolog.Nop())
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func kvctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestCommands(t *testing.T) {
	addr := startStore(t)
	flags := []string{"--endpoints", addr, "--token", testToken}
	steps := []struct {
		args    []string
		want    string
		wantErr string
	}{
		{args: []string{"put", "a", "1"}, want: "OK\n"},
		{args: []string{"get", "a"}, want: "1\n"},
		{args: []string{"cas", "a", "1", "2"}, want: "OK\n"},
		{args: []string{"cas", "a", "1", "3"}, wantErr: `current value "2"`},
		{args: []string{"cas", "--absent", "b", "x"}, want: "OK\n"},
		{args: []string{"scan", "--limit", "1"}, want: "a\t2\n# more keys follow \"a\"\n"},
		{args: []string{"scan", "a", "z"}, want: "a\t2\nb\tx\n"},
		{args: []string{"delete", "a"}, want: "OK\n"},
		{args: []string{"get", "a"}, wantErr: "NOT_FOUND"},
	}
	for _, s := range steps {
		out, err := kvctl(t, append(s.args, flags...)...)
		if s.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), s.wantErr) {
				t.Fatalf("%v: error %v, want %q", s.args, err, s.wantErr)
			}
			continue
		}
		if err != nil || out != s.want {
			t.Fatalf("%v: %q %v, want %q", s.args, out, err, s.want)
		}
	}
	t.Setenv(envEndpoints, addr)
	t.Setenv(envToken, testToken)
	out, err := kvctl(t, "status")
	if err != nil || !strings.Contains(out, "leader:      1 ("+addr+")") || !strings.Contains(out, "leader  ") {
		t.Fatalf("status from env:\n%s\n%v", out, err)
	}
	t.Setenv(envToken, "")
	if _, err := kvctl(t, "get", "a"); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("missing token: %v", err)
	}
}
