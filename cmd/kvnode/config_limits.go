package main

// LimitsConfig is the [limits] table: bounds on client connections and responses.
type LimitsConfig struct{}

func (c *LimitsConfig) validate() error { return nil }
