package main

// AdminConfig is the [admin] table: how the admin endpoint is secured.
type AdminConfig struct{}

func (c *AdminConfig) validate() error { return nil }
