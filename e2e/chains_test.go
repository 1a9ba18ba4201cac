package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"synod/internal/kvmodel"
	"synod/kv/client"
)

// A chain is one client writing a key no other client writes, each write a
// fresh token, so the client can predict the answer to every write it
// sends: a CAS from the value it last saw must succeed, a CAS from a value
// the key never held (every chainDoomedEvery-th write of a CAS chain) must
// fail, a PUT must succeed, and a linearizable read must return the last
// token it wrote (or a later one whose outcome it never learned). Doomed
// CASes make the answers differ from write to write, so an answer handed
// to the wrong writer shows. An answer the prediction rules out
// is a wrong answer: another command's result handed to this writer, or an
// acknowledged write that never took effect. The chains feed the history
// too, so porcupine checks them as well.
type chain struct {
	id   int    // history client id
	key  string // written only by this chain
	cas  bool   // CAS writes; otherwise PUTs
	n    int
	last string // the key's value as this chain knows it ("" with absent)
	// absent: the key holds nothing yet (as far as the chain knows).
	absent bool
	// acked is the last token whose write was acknowledged.
	acked string
	// uncertain holds tokens whose write outcome is unknown: any of them
	// may show up later.
	uncertain map[string]bool
	wrong     []string // descriptions of wrong answers
	writes    int
}

// chainLoad runs chains on a cluster until stopped.
type chainLoad struct {
	eps    []string // the cluster's client endpoints (probeWrong)
	t      *testing.T
	h      *history
	chains []*chain
	stop   chan struct{}
	wg     sync.WaitGroup
	ops    atomic.Int64
	wrongN atomic.Int64 // wrong answers so far (readable while running)
}

// wrongf records a wrong answer of ch (ch's goroutine only), with what
// every node holds for ch's key (probeWrong).
func (l *chainLoad) wrongf(ch *chain, format string, args ...any) {
	ch.wrong = append(ch.wrong, fmt.Sprintf(format, args...)+"; "+l.probeWrong(ch))
	l.wrongN.Add(1)
}

// probeWrong asks every node, right after a wrong answer, for its own
// value of ch's key (a STALE_OK read, which any node serves from its state
// machine) and its role and applied slot: the nodes agreeing on an old
// value says writes were lost; one node alone holding it says its state
// machine diverged (once in CI, 2026-12-07: a CAS chain's key read back
// 259 acknowledged writes old after a leader change, and nothing more
// was known).
func (l *chainLoad) probeWrong(ch *chain) string {
	var b strings.Builder
	b.WriteString("probe:")
	for _, ep := range l.eps {
		ctx, cancel := ctxTimeout(probeWrongTimeout)
		cl, err := client.Dial(ctx, []string{ep}, tenantA.token, client.Options{RetriesMax: 1, RequestTimeout: probeWrongTimeout})
		if err != nil {
			fmt.Fprintf(&b, " %s: dial %v;", ep, err)
			cancel()
			continue
		}
		v, gerr := cl.GetStale(ctx, []byte(ch.key))
		fmt.Fprintf(&b, " %s holds %q (%v)", ep, v, gerr)
		if st, err := cl.StatusAt(ctx, ep); err == nil {
			for _, m := range st.Members {
				if m.ID == st.Self {
					fmt.Fprintf(&b, " node %d %v applied %d commit %d leader %d ballot %v", m.ID, m.Role, m.Applied, m.Commit, st.LeaderID, st.Ballot)
				}
			}
		}
		b.WriteString(";")
		cl.Close()
		cancel()
	}
	return b.String()
}

// probeWrongTimeout bounds each of probeWrong's requests.
const probeWrongTimeout = 2 * time.Second

// Workload of the chains (pause and restart-all tests).
const (
	chainsCAS       = 3
	chainsPut       = 2
	chainOpTimeout  = 8 * time.Second
	chainReadWindow = 30 * time.Second // to learn a key's value after an unknown outcome
	// chainDoomedEvery: every this many writes a CAS chain sends a CAS
	// whose expected value the key never held.
	chainDoomedEvery = 2
)

// startChains starts chainsCAS CAS chains and chainsPut PUT chains whose
// clients dial eps. History client ids start at idBase.
func startChains(t *testing.T, h *history, eps []string, idBase int) *chainLoad {
	l := &chainLoad{eps: eps, t: t, h: h, stop: make(chan struct{})}
	for i := 0; i < chainsCAS+chainsPut; i++ {
		ch := &chain{id: idBase + i, key: fmt.Sprintf("chain/%d", i), cas: i < chainsCAS, absent: true, uncertain: map[string]bool{}}
		l.chains = append(l.chains, ch)
		cl := dialClient(t, eps, tenantA.token, killClientRetries)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer cl.Close()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				l.step(ch, cl)
				l.ops.Add(1)
			}
		}()
	}
	return l
}

// halt stops every chain after its current operation.
func (l *chainLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// wrongAnswers lists every chain's wrong answers (after halt).
func (l *chainLoad) wrongAnswers() []string {
	var out []string
	for _, ch := range l.chains {
		out = append(out, ch.wrong...)
	}
	return out
}

// step sends one write of ch and checks its answer against the prediction.
func (l *chainLoad) step(ch *chain, cl *client.Client) {
	ch.n++
	tok := fmt.Sprintf("c%d-%d", ch.id, ch.n)
	if ch.cas && ch.n%chainDoomedEvery == 0 {
		l.doomed(ch, cl, tok)
		return
	}
	in := kvmodel.Input{Key: ch.key, Value: tok}
	var expect []byte
	if ch.cas {
		in.CAS, in.Expect, in.ExpectAbsent = true, ch.last, ch.absent
		if !ch.absent {
			expect = []byte(ch.last)
		}
	} else {
		in.Put = true
	}
	ctx, cancel := ctxTimeout(chainOpTimeout)
	defer cancel()
	call := l.h.now()
	var err error
	if ch.cas {
		err = cl.CAS(ctx, []byte(ch.key), expect, []byte(tok))
	} else {
		err = cl.Put(ctx, []byte(ch.key), []byte(tok))
	}
	ret := l.h.now()
	ch.writes++
	switch {
	case err == nil:
		l.h.add(ch.id, in, call, ret, kvmodel.Output{})
		ch.last, ch.absent, ch.acked = tok, false, tok
		clear(ch.uncertain)
	case ch.cas && errors.Is(err, client.ErrCASMismatch):
		l.h.add(ch.id, in, call, ret, kvmodel.Output{Mismatch: true})
		// Only a late write of this chain's own can have moved the key.
		v, found, ok := l.learn(ch, cl)
		if ok && !(found && ch.uncertain[v]) {
			l.wrongf(ch, "%s: CAS %q -> %s answered CAS_MISMATCH, but the key holds %q (found %v)", ch.key, ch.last, tok, v, found)
		}
		l.adopt(ch, v, found, ok)
	case errors.Is(err, client.ErrCASMismatch):
		l.h.add(ch.id, in, call, pendingReturn, kvmodel.Output{})
		l.wrongf(ch, "%s: PUT %s answered CAS_MISMATCH", ch.key, tok)
		ch.uncertain[tok] = true
		v, found, ok := l.learn(ch, cl)
		l.adopt(ch, v, found, ok)
	case isDefinite(err):
		// Refused before it was proposed (e.g. THROTTLED after all
		// retries): no effect. Nothing to record.
	default: // outcome unknown
		l.h.add(ch.id, in, call, pendingReturn, kvmodel.Output{Unknown: true})
		ch.uncertain[tok] = true
		v, found, ok := l.learn(ch, cl)
		if ok && found && v != ch.last && !ch.uncertain[v] {
			l.wrongf(ch, "%s: holds %q, which this chain never wrote after %q", ch.key, v, ch.last)
		}
		if ok && !found && !ch.absent {
			l.wrongf(ch, "%s: absent after the acknowledged write of %q", ch.key, ch.acked)
		}
		l.adopt(ch, v, found, ok)
	}
}

// doomed sends a CAS of ch's key from a value the key never held: the only
// right answer is CAS_MISMATCH (or no answer), and the key is unchanged.
func (l *chainLoad) doomed(ch *chain, cl *client.Client, tok string) {
	never := "never-" + tok
	in := kvmodel.Input{CAS: true, Key: ch.key, Value: tok, Expect: never}
	ctx, cancel := ctxTimeout(chainOpTimeout)
	defer cancel()
	call := l.h.now()
	err := cl.CAS(ctx, []byte(ch.key), []byte(never), []byte(tok))
	ret := l.h.now()
	ch.writes++
	switch {
	case errors.Is(err, client.ErrCASMismatch):
		l.h.add(ch.id, in, call, ret, kvmodel.Output{Mismatch: true})
	case err == nil:
		l.h.add(ch.id, in, call, ret, kvmodel.Output{})
		l.wrongf(ch, "%s: CAS from %q, a value the key never held, answered OK", ch.key, never)
	case isDefinite(err):
	default:
		l.h.add(ch.id, in, call, pendingReturn, kvmodel.Output{Unknown: true})
	}
}

// isDefinite reports errors that mean the write was not applied.
func isDefinite(err error) bool {
	return errors.Is(err, client.ErrThrottled) || errors.Is(err, client.ErrTooLarge) ||
		errors.Is(err, client.ErrBadRequest) || errors.Is(err, client.ErrUnauthorized)
}

// learn reads ch's key linearizably (recorded in the history), retrying up
// to chainReadWindow; ok is false when no read succeeded.
func (l *chainLoad) learn(ch *chain, cl *client.Client) (v string, found, ok bool) {
	deadline := time.Now().Add(chainReadWindow)
	for time.Now().Before(deadline) {
		select {
		case <-l.stop:
			return "", false, false
		default:
		}
		ctx, cancel := ctxTimeout(chainOpTimeout)
		call := l.h.now()
		b, err := cl.Get(ctx, []byte(ch.key))
		ret := l.h.now()
		cancel()
		in := kvmodel.Input{Key: ch.key}
		switch {
		case err == nil:
			l.h.add(ch.id, in, call, ret, kvmodel.Output{Found: true, Value: string(b)})
			return string(b), true, true
		case errors.Is(err, client.ErrNotFound):
			l.h.add(ch.id, in, call, ret, kvmodel.Output{})
			return "", false, true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "", false, false
}

// adopt makes the value read the chain's view of its key.
func (l *chainLoad) adopt(ch *chain, v string, found, ok bool) {
	if !ok {
		return
	}
	ch.last, ch.absent = v, !found
	if found && ch.uncertain[v] {
		ch.acked = v
		clear(ch.uncertain)
	}
}

// finalCheck reads every chain's key through cl after the load stopped:
// an acknowledged write must be there, or a later write of the same chain
// whose outcome was unknown. It returns how many chains lost their last
// acknowledged write.
func (l *chainLoad) finalCheck(cl *client.Client) (lost int) {
	for _, ch := range l.chains {
		if ch.acked == "" {
			continue
		}
		var (
			v   []byte
			err error
		)
		deadline := time.Now().Add(killFinalReadLimit)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), chainOpTimeout)
			call := l.h.now()
			v, err = cl.Get(ctx, []byte(ch.key))
			ret := l.h.now()
			cancel()
			if err == nil {
				l.h.add(ch.id, kvmodel.Input{Key: ch.key}, call, ret, kvmodel.Output{Found: true, Value: string(v)})
				break
			}
			if errors.Is(err, client.ErrNotFound) || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || (string(v) != ch.acked && !ch.uncertain[string(v)]) {
			lost++
			l.t.Errorf("%s: last acknowledged write %q lost: final read %q (%v)", ch.key, ch.acked, v, err)
		}
	}
	return lost
}
