package main

// SecurityConfig is the [security] table: the cluster secret that authenticates consensus traffic.
type SecurityConfig struct{}

func (c *SecurityConfig) validate() error { return nil }
