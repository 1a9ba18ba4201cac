package main

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// SecurityConfig is the [security] table: the cluster secret that
// authenticates consensus traffic (kv/replica/auth.go; docs/protocol.md,
// "Authenticated consensus framing"). Every member of a Paxos cluster of
// more than one node must hold the same secret; a node without it, or with
// another, is refused at its first packet.
type SecurityConfig struct {
	// ClusterSecret is the secret, as hex (at least securitySecretBytesMin
	// bytes). Generate one with `openssl rand -hex 32`.
	ClusterSecret string `toml:"cluster_secret"`
	// ClusterSecretFile reads the secret (hex) from a file instead, so the
	// config can be shared without it.
	ClusterSecretFile string `toml:"cluster_secret_file"`
	// AcceptedSecrets are older or newer secrets this node also accepts
	// from peers while a rotation is under way (it seals with the cluster
	// secret only).
	AcceptedSecrets []string `toml:"accepted_secrets"`
}

// Limits of the [security] table.
const (
	securitySecretBytesMin = 16
	securityAcceptedMax    = 3
	securitySecretFileMax  = 4 << 10
)

func (c *SecurityConfig) validate() error {
	if c.ClusterSecret != "" && c.ClusterSecretFile != "" {
		return errors.New("security: set cluster_secret or cluster_secret_file, not both")
	}
	if len(c.AcceptedSecrets) > securityAcceptedMax {
		return fmt.Errorf("security.accepted_secrets: %d secrets, at most %d", len(c.AcceptedSecrets), securityAcceptedMax)
	}
	if len(c.AcceptedSecrets) > 0 && !c.set() {
		return errors.New("security.accepted_secrets: needs a cluster_secret (or cluster_secret_file) to seal with")
	}
	_, err := c.secrets()
	return err
}

// set reports whether a cluster secret is configured.
func (c *SecurityConfig) set() bool { return c.ClusterSecret != "" || c.ClusterSecretFile != "" }

// secrets returns the cluster secret first, then the accepted ones (nil
// when none is configured).
func (c *SecurityConfig) secrets() ([][]byte, error) {
	if !c.set() {
		return nil, nil
	}
	text, key := c.ClusterSecret, "security.cluster_secret"
	if c.ClusterSecretFile != "" {
		key = "security.cluster_secret_file"
		st, err := os.Stat(c.ClusterSecretFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		if st.Size() > securitySecretFileMax {
			return nil, fmt.Errorf("%s: %d bytes, at most %d", key, st.Size(), securitySecretFileMax)
		}
		b, err := os.ReadFile(c.ClusterSecretFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		text = string(b)
	}
	first, err := decodeSecret(key, text)
	if err != nil {
		return nil, err
	}
	out := [][]byte{first}
	for i, s := range c.AcceptedSecrets {
		sec, err := decodeSecret(fmt.Sprintf("security.accepted_secrets[%d]", i), s)
		if err != nil {
			return nil, err
		}
		out = append(out, sec)
	}
	return out, nil
}

func decodeSecret(key, text string) ([]byte, error) {
	b, err := hex.DecodeString(strings.TrimSpace(text))
	if err != nil {
		return nil, fmt.Errorf("%s: not hex: %v", key, err)
	}
	if len(b) < securitySecretBytesMin {
		return nil, fmt.Errorf("%s: %d bytes, want at least %d (32 hex digits)", key, len(b), securitySecretBytesMin)
	}
	return b, nil
}
