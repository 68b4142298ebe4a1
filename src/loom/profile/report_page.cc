// The report page's style sheet and script (report.h). Plain ES2017 and SVG: no library,
// nothing fetched. The script reads the JSON in <script id="data"> and draws each
// <figure class="chart">, setting data-points to the number of values it drew (the report
// test checks every chart has some).
#include "loom/profile/report.h"

namespace loom::profile {

const char* const kReportCss = R"css(
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
header { background: #1f2d3d; color: #fff; padding: 12px 24px; }
header h1 { margin: 0; font-size: 20px; font-weight: 600; }
header h1 span { font-weight: 400; opacity: .8; margin-left: 8px; }
main { padding: 8px 24px 24px; }
h2 { font-size: 16px; margin: 18px 0 8px; }
#summary { border-collapse: collapse; background: #fff; }
#summary th, #summary td { border: 1px solid #ddd; padding: 4px 10px; text-align: left; }
#summary td.v { font-variant-numeric: tabular-nums; text-align: right; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(480px, 1fr)); gap: 12px; }
figure.chart { margin: 0; background: #fff; border: 1px solid #ddd; padding: 8px; }
figure.wide { grid-column: 1 / -1; }
figcaption { font-weight: 600; margin-bottom: 4px; }
.plot { min-height: 40px; }
.plot svg { width: 100%; height: auto; display: block; }
.empty .plot { color: #888; font-style: italic; }
.legend span { margin-right: 12px; white-space: nowrap; font-size: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
svg text { font-size: 10px; fill: #555; }
svg .axis { stroke: #999; stroke-width: 1; }
svg .gridline { stroke: #eee; stroke-width: 1; }
pre { background: #fff; border: 1px solid #ddd; padding: 8px; overflow: auto; max-height: 320px; }
)css";

const char* const kReportJs = R"js(
(function () {
  'use strict';
  const D = JSON.parse(document.getElementById('data').textContent);
  const NS = 'http://www.w3.org/2000/svg';
  const COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948',
                  '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];
  const W = 480, H = 220, ML = 56, MR = 10, MT = 8, MB = 26;

  function el(tag, attrs, parent, text) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(v) {
    const a = Math.abs(v);
    if (a === 0) return '0';
    if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(0) + 'k';
    if (a >= 100) return v.toFixed(0);
    if (a >= 1) return v.toFixed(2);
    return v.toPrecision(2);
  }
  function figure(id) { return document.getElementById('chart-' + id); }
  function empty(id, why) {
    const f = figure(id);
    f.classList.add('empty');
    f.dataset.points = '0';
    f.querySelector('.plot').textContent = why;
  }
  function legend(f, names) {
    const l = f.querySelector('.legend');
    names.forEach(function (n, i) {
      const s = document.createElement('span');
      const box = document.createElement('i');
      box.style.background = COLORS[i % COLORS.length];
      s.appendChild(box);
      s.appendChild(document.createTextNode(n));
      l.appendChild(s);
    });
  }
  function frame(f, x0, x1, y0, y1, height) {
    const h = height || H;
    const svg = el('svg', {viewBox: '0 0 ' + W + ' ' + h, role: 'img'});
    f.querySelector('.plot').appendChild(svg);
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y1 = y0 + Math.abs(y0 || 1) * 0.05; y0 -= Math.abs(y0 || 1) * 0.05; }
    const sx = function (x) { return ML + (x - x0) / (x1 - x0) * (W - ML - MR); };
    const sy = function (y) { return h - MB - (y - y0) / (y1 - y0) * (h - MT - MB); };
    for (let i = 0; i <= 4; ++i) {
      const y = y0 + (y1 - y0) * i / 4;
      el('line', {x1: ML, x2: W - MR, y1: sy(y), y2: sy(y), class: 'gridline'}, svg);
      el('text', {x: ML - 4, y: sy(y) + 3, 'text-anchor': 'end'}, svg, fmt(y));
      const x = x0 + (x1 - x0) * i / 4;  // whole numbers on wide axes (steps, seconds)
      const whole = x1 - x0 >= 8;
      el('text', {x: sx(x), y: h - MB + 14, 'text-anchor': 'middle'}, svg,
         whole ? String(Math.round(x)) : fmt(x));
    }
    el('line', {x1: ML, x2: ML, y1: MT, y2: h - MB, class: 'axis'}, svg);
    el('line', {x1: ML, x2: W - MR, y1: h - MB, y2: h - MB, class: 'axis'}, svg);
    return {svg: svg, sx: sx, sy: sy};
  }
  // series: [{name, pts: [[x, y], ...]}]
  function lines(id, series, why) {
    series = series.filter(function (s) { return s.pts.length > 0; });
    if (!series.length) return empty(id, why || 'not in this run');
    const f = figure(id);
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity, n = 0;
    series.forEach(function (s) {
      s.pts.forEach(function (p) {
        x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]);
        y0 = Math.min(y0, p[1]); y1 = Math.max(y1, p[1]);
        ++n;
      });
    });
    if (y0 > 0 && y0 < 0.3 * y1) y0 = 0;
    const c = frame(f, x0, x1, y0, y1);
    series.forEach(function (s, i) {
      const color = COLORS[i % COLORS.length];
      const d = s.pts.map(function (p, k) {
        return (k ? 'L' : 'M') + c.sx(p[0]).toFixed(1) + ' ' + c.sy(p[1]).toFixed(1);
      }).join('');
      const path = el('path', {d: d, fill: 'none', stroke: color, 'stroke-width': 1.5}, c.svg);
      el('title', {}, path, s.name);
      if (s.pts.length < 40)
        s.pts.forEach(function (p) {
          el('circle', {cx: c.sx(p[0]), cy: c.sy(p[1]), r: 2.5, fill: color}, c.svg);
        });
    });
    legend(f, series.map(function (s) { return s.name; }));
    f.dataset.points = String(n);
  }
  // Grouped bars: labels along x, one bar per series in each group.
  function bars(id, labels, series, why) {
    if (!labels.length || !series.length) return empty(id, why || 'not in this run');
    const f = figure(id);
    let y1 = 0, n = 0;
    series.forEach(function (s) { s.values.forEach(function (v) { y1 = Math.max(y1, v); ++n; }); });
    const c = frame(f, 0, labels.length, 0, y1 || 1);
    const gw = (W - ML - MR) / labels.length, bw = gw * 0.8 / series.length;
    c.svg.querySelectorAll('text').forEach(function (t) {
      if (t.getAttribute('text-anchor') === 'middle') t.remove();
    });
    labels.forEach(function (lab, g) {
      el('text', {x: ML + gw * (g + 0.5), y: H - MB + 14, 'text-anchor': 'middle'}, c.svg, lab);
      series.forEach(function (s, i) {
        const v = s.values[g], x = ML + gw * g + gw * 0.1 + bw * i;
        const r = el('rect', {x: x, width: Math.max(bw - 1, 1), y: c.sy(v),
                              height: c.sy(0) - c.sy(v), fill: COLORS[i % COLORS.length]}, c.svg);
        el('title', {}, r, s.name + ' ' + lab + ': ' + fmt(v));
      });
    });
    legend(f, series.map(function (s) { return s.name; }));
    f.dataset.points = String(n);
  }
  // Stacked bars per step: layers [{name, ys}] over xs.
  function stacked(id, xs, layers, why) {
    if (!xs.length) return empty(id, why);
    const f = figure(id);
    let y1 = 0;
    xs.forEach(function (_, k) {
      let s = 0;
      layers.forEach(function (l) { s += Math.max(0, l.ys[k]); });
      y1 = Math.max(y1, s);
    });
    const c = frame(f, xs[0] - 0.5, xs[xs.length - 1] + 0.5, 0, y1 || 1);
    const bw = Math.max((W - ML - MR) / xs.length * 0.8, 1);
    xs.forEach(function (x, k) {
      let base = 0;
      layers.forEach(function (l, i) {
        const v = Math.max(0, l.ys[k]);
        const r = el('rect', {x: c.sx(x) - bw / 2, width: bw, y: c.sy(base + v),
                              height: c.sy(base) - c.sy(base + v),
                              fill: COLORS[i % COLORS.length]}, c.svg);
        el('title', {}, r, 'step ' + x + ' ' + l.name + ': ' + fmt(v) + ' ms');
        base += v;
      });
    });
    legend(f, layers.map(function (l) { return l.name; }));
    f.dataset.points = String(xs.length * layers.length);
  }
  function mean(a) { return a.reduce(function (s, v) { return s + v; }, 0) / a.length; }
  function median(a) {
    const b = a.slice().sort(function (x, y) { return x - y; });
    const m = b.length >> 1;
    return b.length % 2 ? b[m] : (b[m - 1] + b[m]) / 2;
  }
  function col(key, scale) {
    return D.steps.filter(function (s) { return typeof s[key] === 'number'; })
        .map(function (s) { return [s.step, s[key] * (scale || 1)]; });
  }

  lines('loss', [{name: 'training', pts: col('loss')},
                 {name: 'validation', pts: D.vals.map(function (v) { return [v.step, v.val_loss]; })}]);
  lines('tokens', [{name: 'tokens/s', pts: col('tokens_per_s')}]);
  lines('mfu', [{name: 'MFU %', pts: col('mfu', 100)}]);
  lines('lr', [{name: 'learning rate', pts: col('lr')}]);
  lines('gradnorm', [{name: 'grad norm', pts: col('grad_norm')}]);

  const timed = D.steps.filter(function (s) { return s.compute_ms && s.exposed_comm_ms; });
  if (timed.length) {
    const kinds = [['compute', 'compute_ms'], ['exposed communication', 'exposed_comm_ms'],
                   ['data', 'data_ms'], ['optimizer', 'optim_ms']];
    const layers = kinds.map(function (k) {
      return {name: k[0], ys: timed.map(function (s) { return mean(s[k[1]] || [0]); })};
    });
    layers.push({name: 'idle / other', ys: timed.map(function (s, i) {
      let rest = s.step_ms;
      layers.forEach(function (l) { rest -= l.ys[i]; });
      return Math.max(0, rest);
    })});
    stacked('breakdown', timed.map(function (s) { return s.step; }), layers);
    const ranks = timed[0].exposed_comm_ms.length, labels = [], share = [];
    for (let r = 0; r < ranks; ++r) {
      labels.push('rank ' + r);
      share.push(median(timed.map(function (s) { return 100 * s.exposed_comm_ms[r] / s.step_ms; })));
    }
    bars('commshare', labels, [{name: 'exposed communication %', values: share}]);
  } else {
    empty('breakdown', 'metrics.jsonl has no per-rank time by kind (an older loom wrote it)');
    empty('commshare', 'metrics.jsonl has no per-rank communication times');
  }

  const last = D.steps[D.steps.length - 1];
  if (last.rss_peak_mb) {
    const labels = last.rss_peak_mb.map(function (_, r) { return 'rank ' + r; });
    const series = [{name: 'model state', values: last.state_peak_mb || []},
                    {name: 'activations', values: last.activation_mb || []},
                    {name: 'peak RSS', values: last.rss_peak_mb}]
        .filter(function (s) { return s.values.length === labels.length; });
    bars('memory', labels, series);
  } else {
    empty('memory', 'metrics.jsonl has no per-rank memory');
  }

  const S = D.system;
  if (S.length) {
    const cores = S[0].cpu_busy.length, series = [];
    for (let c = 0; c < cores; ++c)
      series.push({name: 'cpu' + c + ' %', pts: S.map(function (s) { return [s.t_s, 100 * s.cpu_busy[c]]; })});
    (S[S.length - 1].gpus || []).forEach(function (g, k) {
      series.push({name: 'gpu' + g.index + ' %', pts: S.filter(function (s) { return s.gpus && s.gpus[k]; })
          .map(function (s) { return [s.t_s, s.gpus[k].util_pct]; })});
    });
    lines('cpu', series.concat([{name: 'RSS MiB / 100', pts: S.map(function (s) { return [s.t_s, s.rss_mb / 100]; })}]));
    const io = [{name: 'disk read', pts: S.map(function (s) { return [s.t_s, s.disk_read_mbps]; })},
                {name: 'disk write', pts: S.map(function (s) { return [s.t_s, s.disk_write_mbps]; })}];
    Object.keys(S[S.length - 1].net_mbps || {}).forEach(function (dev) {
      io.push({name: dev + ' rx+tx', pts: S.filter(function (s) { return s.net_mbps && s.net_mbps[dev]; })
          .map(function (s) { return [s.t_s, s.net_mbps[dev][0] + s.net_mbps[dev][1]]; })});
    });
    lines('io', io);
  } else {
    empty('cpu', 'no system.jsonl (train.system_sample_s = 0?)');
    empty('io', 'no system.jsonl (train.system_sample_s = 0?)');
  }

  const T = D.trace;
  if (T && T.spans.length) {
    const f = figure('timeline');
    f.querySelector('figcaption').textContent +=
        ' — step ' + T.step + ' (' + T.ms.toFixed(1) + ' ms; the trace holds steps ' +
        T.steps[0] + ' to ' + T.steps[1] + ', loom report --step N picks another)';
    // Rows: each track's spans stacked by nesting depth.
    const rows = [], depthOf = [];
    T.tracks.forEach(function () { rows.push([]); });
    T.spans.forEach(function (s, i) {
      const open = rows[s[0]];
      while (open.length && open[open.length - 1] <= s[1] + 1e-6) open.pop();
      depthOf[i] = open.length;
      open.push(s[1] + s[2]);
    });
    const depth = T.tracks.map(function () { return 1; });
    T.spans.forEach(function (s, i) { depth[s[0]] = Math.max(depth[s[0]], depthOf[i] + 1); });
    const RH = 14, top = [];
    let y = MT;
    T.tracks.forEach(function (t, k) { top.push(y); y += depth[k] * RH + 6; });
    const h = y + MB, LW = 150, ww = 1200;
    const svg = el('svg', {viewBox: '0 0 ' + ww + ' ' + h, role: 'img'});
    f.querySelector('.plot').appendChild(svg);
    const sx = function (t) { return LW + t / T.ms * (ww - LW - MR); };
    T.tracks.forEach(function (t, k) {
      el('text', {x: 4, y: top[k] + 10}, svg, 'rank ' + t.rank + ' ' + t.name);
    });
    const cats = {};
    T.spans.forEach(function (s, i) {
      if (!(s[4] in cats)) cats[s[4]] = Object.keys(cats).length;
      const x0 = Math.max(sx(Math.max(s[1], 0)), LW), x1 = Math.min(sx(s[1] + s[2]), ww - MR);
      const r = el('rect', {x: x0, y: top[s[0]] + depthOf[i] * RH, width: Math.max(x1 - x0, 0.5),
                            height: RH - 2, fill: COLORS[cats[s[4]] % COLORS.length]}, svg);
      el('title', {}, r, s[3] + ' (' + s[4] + ') ' + s[2].toFixed(3) + ' ms' +
                         (s[5] ? ' ' + JSON.stringify(s[5]) : ''));
    });
    for (let i = 0; i <= 10; ++i)
      el('text', {x: sx(T.ms * i / 10), y: h - MB + 14, 'text-anchor': 'middle'}, svg,
         (T.ms * i / 10).toFixed(1) + ' ms');
    legend(f, Object.keys(cats));
    f.dataset.points = String(T.spans.length);
  } else {
    empty('timeline', 'no trace.json: train with train.profile = true (loom run --profile)');
  }
})();
)js";

}  // namespace loom::profile
