package main

import (
	"net"
	"sync"
)

// cappedListener accepts at most max connections open at once: Accept
// waits for one of them to close before it takes the next from the
// kernel's queue, so a flood of connections costs the process at most
// max descriptors (the rest wait in the kernel's backlog, and are
// refused by the kernel once it is full).
type cappedListener struct {
	net.Listener
	slots chan struct{} // one token a connection open
	done  chan struct{} // closed by Close: a waiting Accept returns
	once  sync.Once
}

func newCappedListener(ln net.Listener, max int) *cappedListener {
	return &cappedListener{Listener: ln, slots: make(chan struct{}, max), done: make(chan struct{})}
}

// Accept waits for a free slot, then accepts.
func (l *cappedListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &cappedConn{Conn: c, release: func() { <-l.slots }}, nil
}

// Close closes the listener and wakes a waiting Accept.
func (l *cappedListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// open is the number of accepted connections not yet closed.
func (l *cappedListener) open() int { return len(l.slots) }

// cappedConn gives its slot back once, at its first Close.
type cappedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *cappedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
