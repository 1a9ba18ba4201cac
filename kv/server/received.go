package server

import (
	"context"
	"time"
)

// receivedKey keys the time a request's frame header was read in the
// context Backend.Do receives.
type receivedKey struct{}

// ReceivedAt returns when the server finished reading the header of the
// request whose Backend.Do call ctx belongs to (ok false when ctx does not
// come from the server). The backend times admission with it: the time
// from the header to Do covers the admission hook, reading and decoding
// the body and starting the request's goroutine.
func ReceivedAt(ctx context.Context) (t time.Time, ok bool) {
	t, ok = ctx.Value(receivedKey{}).(time.Time)
	return t, ok
}

// WithReceived returns ctx carrying t as its request's ReceivedAt. Server
// sets it for every request it hands to Backend.Do; another front end of
// the same Backend (or a test) may set it too.
func WithReceived(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, receivedKey{}, t)
}
