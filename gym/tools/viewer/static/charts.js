// Small inline-SVG charts for the viewer: a line chart (several series, shared axes) and a
// bar chart (histograms). No library, no network: each returns an <svg> element.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtNum(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  const a = Math.abs(v);
  if (a !== 0 && (a < 0.01 || a >= 1e5)) return v.toExponential(1);
  if (Number.isInteger(v)) return String(v);
  return a < 10 ? v.toFixed(2) : v.toFixed(1);
}

function ticks(lo, hi, n) {
  if (hi <= lo) return [lo];
  const out = [];
  for (let i = 0; i <= n; i++) out.push(lo + (hi - lo) * i / n);
  return out;
}

// series: [{name, color, points: [[x, y], ...]}]; opts: {title, xLabel, yLabel, yMin, yMax}
function lineChart(series, opts) {
  const W = 460, H = 230, L = 46, R = 12, T = 40, B = 34;
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart line-chart", role: "img"});
  svg.appendChild(svgEl("text", {x: L, y: 16, class: "chart-title"}, opts.title || ""));
  const pts = series.flatMap(s => s.points.filter(p => p[1] !== null && p[1] !== undefined));
  if (!pts.length) {
    svg.appendChild(svgEl("text", {x: W / 2, y: H / 2, class: "chart-empty", "text-anchor": "middle"}, "no data"));
    return svg;
  }
  let xlo = Math.min(...pts.map(p => p[0])), xhi = Math.max(...pts.map(p => p[0]));
  let ylo = opts.yMin ?? Math.min(...pts.map(p => p[1])), yhi = opts.yMax ?? Math.max(...pts.map(p => p[1]));
  if (xhi === xlo) { xlo -= 1; xhi += 1; }
  if (yhi === ylo) { ylo -= 0.5; yhi += 0.5; }
  const sx = x => L + (x - xlo) / (xhi - xlo) * (W - L - R);
  const sy = y => H - B - (y - ylo) / (yhi - ylo) * (H - T - B);
  for (const t of ticks(ylo, yhi, 4)) {
    svg.appendChild(svgEl("line", {x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid"}));
    svg.appendChild(svgEl("text", {x: L - 4, y: sy(t) + 4, "text-anchor": "end", class: "tick"}, fmtNum(t)));
  }
  for (const t of ticks(xlo, xhi, 4)) {
    svg.appendChild(svgEl("text", {x: sx(t), y: H - B + 14, "text-anchor": "middle", class: "tick"}, fmtNum(t)));
  }
  svg.appendChild(svgEl("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "axis-label"},
                        opts.xLabel || ""));
  let lx = L;  // the legend: one row under the title
  for (const s of series) {
    svg.appendChild(svgEl("text", {x: lx, y: 31, class: "legend", fill: s.color}, `━ ${s.name}`));
    lx += 20 + 6.5 * s.name.length;
  }
  for (const s of series) {
    const ok = s.points.filter(p => p[1] !== null && p[1] !== undefined);
    const d = ok.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    svg.appendChild(svgEl("path", {d, class: "series", stroke: s.color, "data-series": s.name}));
    if (ok.length <= 60) {
      for (const p of ok) svg.appendChild(svgEl("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: s.color}));
    }
  }
  return svg;
}

// labels: bin labels; counts: numbers; opts: {title, xLabel}
function barChart(labels, counts, opts) {
  const W = 460, H = 220, L = 46, R = 12, T = 26, B = 40;
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart bar-chart", role: "img"});
  svg.appendChild(svgEl("text", {x: L, y: 16, class: "chart-title"}, opts.title || ""));
  if (!counts.length) {
    svg.appendChild(svgEl("text", {x: W / 2, y: H / 2, class: "chart-empty", "text-anchor": "middle"}, "no data"));
    return svg;
  }
  const max = Math.max(...counts, 1);
  const bw = (W - L - R) / counts.length;
  const yt = max <= 4 ? Array.from({length: max + 1}, (_, i) => i) : ticks(0, max, 4);  // whole counts
  for (const t of yt) {
    const y = H - B - t / max * (H - T - B);
    svg.appendChild(svgEl("line", {x1: L, x2: W - R, y1: y, y2: y, class: "grid"}));
    svg.appendChild(svgEl("text", {x: L - 4, y: y + 4, "text-anchor": "end", class: "tick"}, fmtNum(Math.round(t))));
  }
  const every = Math.max(1, Math.ceil(counts.length / 6));
  counts.forEach((c, i) => {
    const h = c / max * (H - T - B);
    const bar = svgEl("rect", {x: L + i * bw + 1, y: H - B - h, width: Math.max(1, bw - 2), height: h, class: "bar"});
    bar.appendChild(svgEl("title", {}, `${labels[i]}: ${c}`));
    svg.appendChild(bar);
    if (i % every === 0) {
      svg.appendChild(svgEl("text", {x: L + i * bw + bw / 2, y: H - B + 14, "text-anchor": "middle", class: "tick"},
                            labels[i]));
    }
  });
  svg.appendChild(svgEl("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "axis-label"},
                        opts.xLabel || ""));
  return svg;
}

// A server histogram {lo, hi, counts} -> bar chart with bin-start labels.
function histChart(h, opts) {
  if (!h || !h.n) return barChart([], [], opts);
  const w = (h.hi - h.lo) / h.counts.length;
  const labels = h.counts.map((_, i) => fmtNum(h.lo + i * w));
  const title = `${opts.title} (n ${h.n}, p50 ${fmtNum(h.p50)}, p95 ${fmtNum(h.p95)})`;
  return barChart(labels, h.counts, {...opts, title});
}
