package main

import (
	"fmt"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"synod/bench/hist"
)

// ninesTicks labels a percentile axis whose x is the number of nines.
type ninesTicks struct{}

func (ninesTicks) Ticks(min, max float64) []plot.Tick {
	labels := []string{"0", "90", "99", "99.9", "99.99", "99.999"}
	var out []plot.Tick
	for i, l := range labels {
		if float64(i) >= min && float64(i) <= max {
			out = append(out, plot.Tick{Value: float64(i), Label: l})
		}
	}
	return out
}

func nines(p float64) float64 {
	if p >= 100 {
		return 5
	}
	return -math.Log10(1 - p/100)
}

func curveXY(c []hist.Point) plotter.XYs {
	xy := make(plotter.XYs, 0, len(c))
	for _, pt := range c {
		xy = append(xy, plotter.XY{X: nines(pt.Percentile), Y: math.Max(float64(pt.Us)/1000, 0.001)})
	}
	return xy
}

// writePlots writes latency-percentile curves (steady read and write, one
// line per path) and per-tenant P99 bars (noisy phase) to dir.
func writePlots(dir string, r *Report) ([]string, error) {
	var files []string
	for _, kind := range []string{"write", "read"} {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("steady %s latency by percentile (open loop, %.0f ops/s)", kind, r.Options.Rate)
		p.X.Label.Text = "percentile"
		p.Y.Label.Text = "latency (ms, log scale)"
		p.X.Tick.Marker = ninesTicks{}
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Legend.Top = true
		p.Legend.Left = true
		var lines []any
		for _, pr := range r.Paths {
			ph := pr.Phases["steady"]
			if pr.Status != "ok" || ph == nil {
				continue
			}
			c := ph.WriteCurve
			if kind == "read" {
				c = ph.ReadCurve
			}
			if len(c) == 0 {
				continue
			}
			lines = append(lines, fmt.Sprintf("%s [%s]", pr.Name, shortDur(pr.Durability)), curveXY(c))
		}
		if len(lines) == 0 {
			continue
		}
		if err := plotutil.AddLines(p, lines...); err != nil {
			return files, err
		}
		f := filepath.Join(dir, fmt.Sprintf("latency-%s.png", kind))
		if err := p.Save(10*vg.Inch, 6*vg.Inch, f); err != nil {
			return files, err
		}
		files = append(files, f)
	}

	p := plot.New()
	p.Title.Text = "per-tenant P99 with the noisy neighbour (tenant 1), by path"
	p.X.Label.Text = "tenant"
	p.Y.Label.Text = "P99 (ms)"
	p.Legend.Top = true
	var bars []*PathResult
	for _, pr := range r.Paths {
		if pr.Status == "ok" && pr.Phases["noisy"] != nil {
			bars = append(bars, pr)
		}
	}
	if len(bars) > 0 {
		w := vg.Points(max(2, 300/float64(len(bars)*r.Options.Tenants)))
		for i, pr := range bars {
			vals := plotter.Values{}
			for _, us := range pr.Phases["noisy"].TenantP99Us {
				vals = append(vals, float64(us)/1000)
			}
			b, err := plotter.NewBarChart(vals, w)
			if err != nil {
				return files, err
			}
			b.Color = plotutil.Color(i)
			b.LineStyle.Width = 0
			b.Offset = vg.Length(i-len(bars)/2) * w
			p.Add(b)
			p.Legend.Add(fmt.Sprintf("%s [%s]", pr.Name, shortDur(pr.Durability)), b)
		}
		names := make([]string, r.Options.Tenants)
		for t := range names {
			if t == 0 || (t+1)%4 == 0 {
				names[t] = fmt.Sprint(t + 1)
			}
		}
		p.NominalX(names...)
		f := filepath.Join(dir, "tenant-p99.png")
		if err := p.Save(12*vg.Inch, 5*vg.Inch, f); err != nil {
			return files, err
		}
		files = append(files, f)
	}
	return files, nil
}

func shortDur(d string) string {
	for i, c := range d {
		if c == ' ' {
			return d[:i]
		}
	}
	return d
}
