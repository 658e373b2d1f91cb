// The status page served at `/`: plain HTML, CSS and a small script that reads the JSON
// API every two seconds. Loss curves are SVG polylines drawn from each job's metrics.
#include "cluster/service/http_api.h"

namespace loom::service {

const char* status_page_html() {
  return R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Loom fleet</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
  h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #ddd; vertical-align: top; }
  th { background: #f4f4f4; }
  .bar { background: #e8e8e8; width: 120px; height: 10px; display: inline-block; }
  .bar > span { background: #3b7; height: 10px; display: block; }
  .state-running { color: #06c; } .state-succeeded { color: #080; }
  .state-failed, .state-unplaceable { color: #c00; } .state-queued { color: #777; }
  .reason { color: #555; font-size: 12px; max-width: 40em; }
  svg.curve { background: #fafafa; border: 1px solid #ddd; }
  polyline { fill: none; stroke: #06c; stroke-width: 1.5; }
  #error { color: #c00; }
</style>
</head>
<body>
<h1>Loom fleet</h1>
<div id="error"></div>
<h2>Pools</h2>
<table id="pools"><thead><tr><th>pool</th><th>backend</th><th>executor</th><th>slots used</th>
<th>utilisation</th><th>price / h</th><th>state</th></tr></thead><tbody></tbody></table>
<h2>Jobs</h2>
<table id="jobs"><thead><tr><th>id</th><th>name</th><th>state</th><th>pool</th><th>priority</th>
<th>attempts</th><th>loss</th><th>placement and reason</th></tr></thead><tbody></tbody></table>
<script>
const token = new URLSearchParams(location.search).get('token');
const headers = token ? { Authorization: 'Bearer ' + token } : {};
async function get(path) {
  const r = await fetch(path, { headers });
  if (!r.ok) throw new Error(path + ': HTTP ' + r.status);
  return r.json();
}
function cell(text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}
function curve(points) {
  const ns = 'http://www.w3.org/2000/svg', w = 220, h = 60;
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'curve');
  svg.setAttribute('width', w);
  svg.setAttribute('height', h);
  if (points.length >= 2) {
    const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    const sx = x => 4 + (w - 8) * (x - x0) / Math.max(x1 - x0, 1e-9);
    const sy = y => h - 4 - (h - 8) * (y - y0) / Math.max(y1 - y0, 1e-9);
    const line = document.createElementNS(ns, 'polyline');
    line.setAttribute('points', points.map(p => sx(p[0]).toFixed(1) + ',' + sy(p[1]).toFixed(1)).join(' '));
    svg.appendChild(line);
    const title = document.createElementNS(ns, 'title');
    title.textContent = 'loss ' + ys[0].toFixed(3) + ' -> ' + ys[ys.length - 1].toFixed(3) +
                        ' over ' + points.length + ' logged steps';
    svg.appendChild(title);
  }
  return svg;
}
async function refresh() {
  try {
    const [pools, jobs] = await Promise.all([get('/api/pools'), get('/api/jobs')]);
    const pb = document.querySelector('#pools tbody');
    pb.replaceChildren();
    for (const p of pools.pools) {
      const tr = document.createElement('tr');
      tr.className = 'pool';
      tr.append(cell(p.name), cell(p.backend), cell(p.executor), cell(p.used + ' / ' + p.slots));
      const td = document.createElement('td'), bar = document.createElement('span');
      const outer = document.createElement('span');
      outer.className = 'bar';
      bar.style.width = Math.round(100 * p.utilization) + '%';
      outer.appendChild(bar);
      td.appendChild(outer);
      tr.append(td, cell(p.price_per_hour.toFixed(2)), cell(p.draining ? 'draining' : 'open'));
      pb.appendChild(tr);
    }
    const jb = document.querySelector('#jobs tbody');
    const rows = [];
    for (const j of jobs.jobs) {
      const tr = document.createElement('tr');
      tr.className = 'job';
      tr.dataset.id = j.id;
      tr.append(cell(j.id), cell(j.name), cell(j.state, 'state-' + j.state), cell(j.pool || '-'),
                cell(j.priority), cell(j.attempts));
      const lossCell = document.createElement('td');
      if (j.attempts > 0) {
        const c = await get('/api/jobs/' + j.id + '/curve');
        lossCell.appendChild(curve(c.curve));
      }
      tr.append(lossCell, cell(j.reason, 'reason'));
      rows.push(tr);
    }
    jb.replaceChildren(...rows);
    document.getElementById('error').textContent = '';
    document.body.dataset.loaded = 'true';
  } catch (e) {
    document.getElementById('error').textContent = String(e);
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)html";
}

}  // namespace loom::service
