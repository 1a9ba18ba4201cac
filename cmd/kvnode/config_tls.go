package main

// TLSConfig is the [tls] table: TLS on the client port.
type TLSConfig struct{}

func (c *TLSConfig) validate() error { return nil }
