package main

import (
	"strings"
	"testing"
)

// respConfig is the example config with top-level keys top added before
// its first table.
func respExample(t *testing.T, top string) []byte {
	ex := readExample(t)
	i := strings.Index(ex, "\n[")
	return []byte(ex[:i+1] + top + ex[i+1:])
}

func TestRESPListenParse(t *testing.T) {
	c, err := parseConfig(respExample(t, "resp_listen = \"127.0.0.1:7031\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.RESPListen != "127.0.0.1:7031" {
		t.Fatalf("resp_listen = %q", c.RESPListen)
	}
	if tlsConf, err := c.respProxyTLS(); err != nil || tlsConf != nil {
		t.Fatalf("proxy TLS without [tls]: %v %v", tlsConf, err)
	}
	c, err = parseConfig([]byte(readExample(t)))
	if err != nil || c.RESPListen != "" {
		t.Fatalf("off by default: %q %v", c.RESPListen, err)
	}
}

func TestRESPListenInvalid(t *testing.T) {
	for _, tc := range []struct{ top, want string }{
		{"resp_listen = \"7031\"\n", "resp_listen"},
		{"resp_listen = \"127.0.0.1:7001\"\n", "resp_listen: \"127.0.0.1:7001\" is also client_listen"},
		{"resp_leader_ca_file = \"/etc/ca.crt\"\n", "resp_leader_ca_file: needs resp_listen"},
		{"resp_listen = \"127.0.0.1:7031\"\nresp_leader_ca_file = \"/etc/ca.crt\"\n", "resp_leader_ca_file: needs a [tls] table"},
		{"resp_listn = \"127.0.0.1:7031\"\n", "unknown key(s) resp_listn"},
	} {
		_, err := parseConfig(respExample(t, tc.top))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.top, err, tc.want)
		}
	}
}
