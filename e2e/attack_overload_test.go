package e2e

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/kv/client"
)

// Overload beyond a tenant's contract (item 6 of the hostile-input
// review): a bulk tenant whose contract is far above what the cluster can
// commit floods writes, open loop at 1.5x the capacity measured a moment
// before, while a critical tenant keeps writing and reading. The nodes must
// shed the bulk load (THROTTLED) before consensus suffers: no leader
// change, nothing of the critical tenant shed, its requests succeed.
func init() { attackSets = append(attackSets, overloadAttacks) }

const (
	overloadMeasure     = 1500 * time.Millisecond
	overloadMeasureConc = 64
	overloadFlood       = 6 * time.Second
	overloadFactor      = 1.5  // offered load over the measured capacity
	overloadConns       = 8    // flooding clients
	overloadInflightMax = 1024 // the generator's own bound on requests in flight
	overloadVictims     = 4
	// overloadVictimErrMax is the share of the victim's requests that may
	// fail (each is retried by its client before it counts as failed).
	overloadVictimErrMax = 0.01
)

func overloadAttacks() []attack {
	return []attack{{name: "bulk tenant offering 1.5x capacity beside a critical tenant", run: func(t *testing.T, c *cluster, cl *client.Client) string {
		l := c.leader()
		var flooders []*client.Client
		for i := 0; i < overloadConns; i++ {
			fc := dialClient(t, c.endpoints(), tenantBulk.token, 2)
			defer fc.Close()
			flooders = append(flooders, fc)
		}
		val := make([]byte, 256)
		put := func(fc *client.Client, n int64) error {
			ctx, cancel := ctxTimeout(killOpTimeout)
			defer cancel()
			return fc.Put(ctx, []byte(fmt.Sprintf("flood/%d", n%4096)), val)
		}
		// The cluster's capacity for this tenant's writes, closed loop.
		var measured atomic.Int64
		stopM := make(chan struct{})
		var wgM sync.WaitGroup
		for i := 0; i < overloadMeasureConc; i++ {
			wgM.Add(1)
			go func() {
				defer wgM.Done()
				for n := int64(i); ; n += overloadMeasureConc {
					select {
					case <-stopM:
						return
					default:
					}
					if put(flooders[i%overloadConns], n) == nil {
						measured.Add(1)
					}
				}
			}()
		}
		time.Sleep(overloadMeasure)
		close(stopM)
		wgM.Wait()
		capacity := float64(measured.Load()) / overloadMeasure.Seconds()
		rate := overloadFactor * capacity
		if rate < 100 {
			return fmt.Sprintf("measured a capacity of %.0f writes/s: the cluster is not serving", capacity)
		}
		before, err := c.status(l)
		if err != nil {
			return fmt.Sprintf("status: %v", err)
		}

		// Open loop at 1.5x that capacity: requests are issued on schedule
		// whether or not earlier ones were answered.
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var floodOK, floodThrottled, skipped atomic.Int64
		slots := make(chan struct{}, overloadInflightMax)
		wg.Add(1)
		go func() {
			defer wg.Done()
			interval := time.Duration(float64(time.Second) / rate)
			next := time.Now()
			for n := int64(0); ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				next = next.Add(interval)
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				select {
				case slots <- struct{}{}:
				default:
					skipped.Add(1) // the generator's own bound: not offered
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-slots }()
					switch err := put(flooders[n%overloadConns], n); {
					case err == nil:
						floodOK.Add(1)
					case errors.Is(err, client.ErrThrottled):
						floodThrottled.Add(1)
					}
				}()
			}
		}()
		var victimOK, victimFailed atomic.Int64
		var firstErr atomic.Value
		for v := 0; v < overloadVictims; v++ {
			vc := dialClient(t, c.endpoints(), tenantCrit.token, killClientRetries)
			defer vc.Close()
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					key := []byte(fmt.Sprintf("victim/%d/%d", v, n%16))
					ctx, cancel := ctxTimeout(killOpTimeout)
					err := vc.Put(ctx, key, []byte("v"))
					if err == nil {
						_, err = vc.Get(ctx, key)
					}
					cancel()
					if err != nil {
						victimFailed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					} else {
						victimOK.Add(1)
					}
					time.Sleep(time.Millisecond)
				}
			}()
		}
		time.Sleep(overloadFlood)
		close(stop)
		wg.Wait()
		var shedBulk, shedCrit float64
		for _, nd := range c.nodes {
			shedBulk += metricValue(nd, `synod_overload_shed_total{class="bulk"}`)
			shedCrit += metricValue(nd, `synod_overload_shed_total{class="critical"}`)
		}
		after, err := c.status(l)
		fmt.Printf("attacks: overload capacity=%.0f/s offered=%.0f/s flood_ok=%d flood_throttled=%d generator_skipped=%d shed_bulk=%.0f shed_critical=%.0f victim_ok=%d victim_failed=%d ballot_before=%v ballot_after=%v\n",
			capacity, rate, floodOK.Load(), floodThrottled.Load(), skipped.Load(), shedBulk, shedCrit, victimOK.Load(), victimFailed.Load(), before.Promised, afterBallot(after))
		switch {
		case err != nil || after.Role != "leader" || after.Promised != before.Promised:
			return fmt.Sprintf("leadership changed under the flood: node %d at %v before, %+v after", l.id, before.Promised, after)
		case shedCrit > 0:
			return fmt.Sprintf("the overload guard shed %.0f requests of the critical tenant", shedCrit)
		case victimOK.Load() == 0:
			return "the critical tenant completed nothing"
		case float64(victimFailed.Load()) > overloadVictimErrMax*float64(victimOK.Load()+victimFailed.Load()):
			return fmt.Sprintf("%d of %d of the critical tenant's requests failed (first: %v)", victimFailed.Load(), victimOK.Load()+victimFailed.Load(), firstErr.Load())
		}
		return ""
	}}}
}

func afterBallot(st *nodeStatus) any {
	if st == nil {
		return "unknown"
	}
	return st.Promised
}
