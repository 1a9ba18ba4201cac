package rtl

import (
	"errors"
	"fmt"
	"io"
	"os"

	"synod/accel"
)

// groupReader reads a trace one input at a time: the input and the outputs
// that follow it.
type groupReader struct {
	tr     *accel.TraceReader
	peeked *accel.Event
}

func (g *groupReader) next() (in accel.Event, outs []accel.Event, err error) {
	var e accel.Event
	if g.peeked != nil {
		e, g.peeked = *g.peeked, nil
	} else if e, err = g.tr.Next(); err != nil {
		return e, nil, err
	}
	if !e.Kind.IsInput() {
		return e, nil, fmt.Errorf("output %v before any input", e)
	}
	in = e
	for {
		e, err := g.tr.Next()
		if errors.Is(err, io.EOF) {
			return in, outs, nil
		}
		if err != nil {
			return in, outs, err
		}
		if e.Kind.IsInput() {
			g.peeked = &e
			return in, outs, nil
		}
		outs = append(outs, e)
	}
}

// compareResult is what compareTraces found.
type compareResult struct {
	Inputs, Outputs, Mismatches uint64
	First                       []string // the first few mismatches, described
	// Coverage counts the model's outputs by kind, and hand-ups and admit
	// verdicts by reason, so a test can insist every path was exercised.
	Coverage map[string]uint64
}

func (r *compareResult) add(o compareResult) {
	r.Inputs += o.Inputs
	r.Outputs += o.Outputs
	r.Mismatches += o.Mismatches
	for _, f := range o.First {
		if len(r.First) < mismatchesShownMax {
			r.First = append(r.First, f)
		}
	}
	if r.Coverage == nil {
		r.Coverage = map[string]uint64{}
	}
	for k, v := range o.Coverage {
		r.Coverage[k] += v
	}
}

func coverageKey(e accel.Event) string {
	switch e.Kind {
	case accel.OutHandUp:
		return fmt.Sprintf("%v/%v/reason=%d", e.Kind, accel.Kind(e.Len), e.Flags)
	case accel.OutAdmit:
		return fmt.Sprintf("%v/ok=%d", e.Kind, e.Flags)
	}
	return e.Kind.String()
}

const mismatchesShownMax = 5

// compareTraces walks the model's trace and the RTL's trace in step: the
// inputs must be identical, and for each input the outputs must be equal
// in number, order and every field. Each input whose outputs differ counts
// one mismatch.
func compareTraces(modelPath, rtlPath string) (compareResult, error) {
	res := compareResult{Coverage: map[string]uint64{}}
	mf, err := os.Open(modelPath)
	if err != nil {
		return res, err
	}
	defer mf.Close()
	rf, err := os.Open(rtlPath)
	if err != nil {
		return res, err
	}
	defer rf.Close()
	mt, err := accel.NewTraceReader(mf)
	if err != nil {
		return res, fmt.Errorf("model trace: %w", err)
	}
	rt, err := accel.NewTraceReader(rf)
	if err != nil {
		return res, fmt.Errorf("rtl trace: %w", err)
	}
	if mt.Spec() != rt.Spec() {
		return res, fmt.Errorf("specs differ: model %+v rtl %+v", mt.Spec(), rt.Spec())
	}
	mg, rg := &groupReader{tr: mt}, &groupReader{tr: rt}
	for {
		mIn, mouts, merr := mg.next()
		rin, routs, rerr := rg.next()
		if errors.Is(merr, io.EOF) && errors.Is(rerr, io.EOF) {
			return res, nil
		}
		if merr != nil || rerr != nil {
			return res, fmt.Errorf("after %d inputs: model: %v, rtl: %v", res.Inputs, merr, rerr)
		}
		if mIn != rin {
			return res, fmt.Errorf("input streams diverge: model %v, rtl %v", mIn, rin)
		}
		res.Inputs++
		res.Outputs += uint64(len(mouts))
		for _, o := range mouts {
			res.Coverage[coverageKey(o)]++
		}
		if d := diffOutputs(mouts, routs); d != "" {
			res.Mismatches++
			if len(res.First) < mismatchesShownMax {
				res.First = append(res.First, fmt.Sprintf("input %v: %s", mIn, d))
			}
		}
	}
}

func diffOutputs(model, rtl []accel.Event) string {
	if len(model) != len(rtl) {
		return fmt.Sprintf("model emitted %d outputs %v, rtl %d %v", len(model), model, len(rtl), rtl)
	}
	for i := range model {
		if model[i] != rtl[i] {
			return fmt.Sprintf("output %d: model %v, rtl %v", i, model[i], rtl[i])
		}
	}
	return ""
}
