package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/client"
)

// Workload of TestClientChurn: many client objects, each with many
// goroutines waiting on it, through repeated leader kills.
const (
	churnClients    = 16
	churnWaiters    = 32 // goroutines per client, each with one call in flight
	churnKills      = 4
	churnOpTimeout  = 5 * time.Second
	churnSettle     = 700 * time.Millisecond // steady load after each restart
	churnProgressIn = 20 * time.Second       // every client completes a write within this of a restart
	// churnDownSlack widens each measured down time in the bound: a
	// connection made just before the kill may die unanswered, and the
	// harness sees the node go and come back a little late.
	churnDownSlack = time.Second
)

// countingProxy is a real listener in front of one node for one client: it
// counts the connections it accepts (every connection the client opens to
// that node, whether or not the node is up) and pipes each to the node.
type countingProxy struct {
	ln      net.Listener
	backend string
	accepts atomic.Int64
	wg      sync.WaitGroup
}

func newCountingProxy(t *testing.T, backend string) *countingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln, backend: backend}
	p.wg.Add(1)
	go p.serve()
	return p
}

func (p *countingProxy) serve() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepts.Add(1)
		go p.pipe(nc)
	}
}

// pipe joins nc to a new connection to the node; when the node is down
// nc is closed at once (to the client, a dial that failed).
func (p *countingProxy) pipe(nc net.Conn) {
	defer nc.Close()
	bc, err := net.DialTimeout("tcp", p.backend, time.Second)
	if err != nil {
		return
	}
	defer bc.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(bc, nc); done <- struct{}{} }()
	go func() { io.Copy(nc, bc); done <- struct{}{} }()
	<-done // either side gone: close both
}

func (p *countingProxy) close() {
	p.ln.Close()
	p.wg.Wait()
}

// TestClientChurn: 16 clients with 32 calls waiting on each write through
// SIGKILLs of the leader (each killed node restarted). Every client
// reaches each node through a proxy of its own that counts accepted
// connections, and the connections each client opens to each node stay
// within the bound kv/client's back-off allows: one per up period of the
// node, plus client.DialsAllowed(down time + churnDownSlack) per kill of
// it. (The client used to dial once per waiting call whenever a
// connection was missing: 1,328 connections from 16 clients to one node in
// the run that found it.)
func TestClientChurn(t *testing.T) {
	c := newCluster(t, 3)
	c.leader()

	// proxies[i][addr]: client i's proxy in front of the node at addr.
	proxies := make([]map[string]*countingProxy, churnClients)
	clients := make([]*client.Client, churnClients)
	for i := range clients {
		proxies[i] = map[string]*countingProxy{}
		for _, nd := range c.nodes {
			p := newCountingProxy(t, nd.client)
			defer p.close()
			proxies[i][nd.client] = p
		}
		own := proxies[i]
		var d net.Dialer
		cl, err := client.Dial(context.Background(), c.endpoints(), tenantA.token, client.Options{
			RequestTimeout: churnOpTimeout,
			// Endpoints and NOT_LEADER hints name the nodes; this client
			// reaches each through its own counting proxy.
			Dial: func(ctx context.Context, addr string) (net.Conn, error) {
				p := own[addr]
				if p == nil {
					return nil, fmt.Errorf("no proxy for %s", addr)
				}
				return d.DialContext(ctx, "tcp", p.ln.Addr().String())
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients[i] = cl
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var okOps, failedOps atomic.Int64
	lastOK := make([]atomic.Int64, churnClients) // unix nanos of each client's latest acknowledged write
	for i, cl := range clients {
		for w := 0; w < churnWaiters; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := ctxTimeout(churnOpTimeout)
					err := cl.Put(ctx, []byte(fmt.Sprintf("churn/%d/%d/%d", i, w, n)), []byte("v"))
					cancel()
					if err != nil {
						failedOps.Add(1)
						time.Sleep(10 * time.Millisecond) // a failed call does not spin
						continue
					}
					okOps.Add(1)
					lastOK[i].Store(time.Now().UnixNano())
				}
			}()
		}
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()

	kills := map[int]int{}            // node id -> kills
	down := map[int][]time.Duration{} // node id -> each down time
	time.Sleep(churnSettle)
	for r := 0; r < churnKills; r++ {
		ld := c.leader()
		killed := time.Now()
		c.kill(ld)
		nl := c.leader(ld)
		c.start(ld)
		d := time.Since(killed)
		kills[ld.id]++
		down[ld.id] = append(down[ld.id], d)
		restarted := time.Now()
		// Every client makes progress again.
		for i := range clients {
			for lastOK[i].Load() < restarted.UnixNano() {
				if time.Since(restarted) > churnProgressIn {
					t.Fatalf("round %d: client %d acknowledged no write within %v of node %d's restart", r, i, churnProgressIn, ld.id)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		t.Logf("round %d: killed leader %d, new leader %d, down %v", r, ld.id, nl.id, d.Round(time.Millisecond))
		time.Sleep(churnSettle)
	}

	var opened int64
	maxPer, worst := int64(0), ""
	for _, nd := range c.nodes {
		bound := int64(1) // the first up period
		for _, d := range down[nd.id] {
			bound += 1 + int64(client.DialsAllowed(d+churnDownSlack))
		}
		for i := range clients {
			n := proxies[i][nd.client].accepts.Load()
			opened += n
			if n > maxPer {
				maxPer, worst = n, fmt.Sprintf("client %d to node %d", i, nd.id)
			}
			if n > bound {
				t.Errorf("client %d opened %d connections to node %d (killed %d times, down %v); the back-off allows %d",
					i, n, nd.id, kills[nd.id], down[nd.id], bound)
			}
		}
	}
	fmt.Printf("client churn: clients=%d waiters=%d leader_changes=%d conns_opened=%d max_per_client_endpoint=%d (%s) ops_ok=%d ops_failed=%d\n",
		churnClients, churnClients*churnWaiters, churnKills, opened, maxPer, worst, okOps.Load(), failedOps.Load())
	// A call rides out a leader change within its timeout by retrying on
	// the new leader (client.Client); at worst the change costs each
	// waiting call one failure. More means calls failed fast and were
	// retried by this loop, over and over, through the outage (runs have
	// seen 0-288; 441-688 when a pipeline gate throttled one tenant).
	if failed, most := failedOps.Load(), int64(churnKills*churnClients*churnWaiters); failed > most {
		t.Errorf("%d calls failed over %d leader changes: more than one per waiting call per change (%d)", failed, churnKills, most)
	}
}
