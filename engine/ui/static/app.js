// raystream web UI: polls /api/jobs and /api/jobs/<id> every second and draws the jobs,
// the selected job's graph with live figures, its checkpoints (table and uPlot charts),
// its failures, and the savepoint / stop / cancel buttons (the JobClient calls of the CLI).
"use strict";

const POLL_MS = 1000;
let selected = new URLSearchParams(location.hash.slice(1)).get("job");
let graphKey = null;       // the drawn graph's job and shape: redrawn only when it changes
let charts = null;         // the two uPlot charts of the selected job
let chartedRows = -1;
let chartedJob = null;

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, text) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
};

function num(value, digits = 0) {
  return value === null || value === undefined ? "-"
    : value.toLocaleString("en-US", {maximumFractionDigits: digits, minimumFractionDigits: digits});
}
function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}
const seconds = (s) => (s === null || s === undefined ? "-" : `${s.toFixed(3)} s`);
const when = (epochS) => (epochS ? new Date(epochS * 1000).toLocaleString() : "-");
const percent = (r) => (r === null || r === undefined ? "-" : `${(r * 100).toFixed(0)}%`);
// a duration in the unit that reads best: "850 ms", "1.2 s", "4.5 min", "3.0 years"
const DURATION_UNITS = [[365.25 * 86400e3, "years"], [86400e3, "days"], [3600e3, "h"],
                        [60e3, "min"], [1e3, "s"]];
function duration(ms) {
  if (ms === null || ms === undefined) return "-";
  for (const [size, unit] of DURATION_UNITS) {
    if (Math.abs(ms) >= size) return `${(ms / size).toFixed(1)} ${unit}`;
  }
  return `${Math.round(ms)} ms`;
}
function showLag(node, ms) {  // the figure as a duration; the milliseconds in data-ms
  node.textContent = duration(ms);
  node.dataset.ms = ms === null || ms === undefined ? "" : String(ms);
}

async function getJSON(url) {
  const response = await fetch(url, {credentials: "same-origin"});
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

async function pollJobs() {
  const jobs = await getJSON("/api/jobs");
  if (!selected && jobs.length) {
    const running = jobs.find((j) => j.status === "RUNNING");
    selected = (running || jobs[0]).job_id;
  }
  const body = $("#jobs tbody");
  body.replaceChildren(...jobs.map((job) => {
    const row = el("tr", {"data-job": job.job_id, title: job.job_id});
    if (job.job_id === selected) row.classList.add("selected");
    row.append(el("td", {}, job.name), el("td", {class: `status ${job.status}`}, job.status),
               el("td", {}, String(job.checkpoints)));
    row.onclick = () => { selected = job.job_id; location.hash = `job=${job.job_id}`; tick(); };
    return row;
  }));
}

async function pollJob() {
  if (!selected) return;
  const job = await getJSON(`/api/jobs/${encodeURIComponent(selected)}`);
  $("#job").hidden = false;
  $("#job-title").replaceChildren(
    el("span", {}, `${job.name} `), el("span", {class: `status ${job.status}`, id: "job-status"},
                                       job.status));
  $("#job-summary").textContent = `${job.job_id} · started ${when(job.started_at)}` +
    ` · restarts ${job.restarts}` + (job.error ? ` · ${job.error.split("\n")[0]}` : "");
  drawProgress(job.progress || {});
  for (const id of ["#savepoint-button", "#stop-button", "#cancel-button"]) {
    $(id).disabled = !job.live;
  }
  drawGraph(job);
  if (chartedJob !== job.job_id && charts !== null) {  // another job: charts of its own
    charts.forEach((chart) => chart.destroy());
    charts = null;
    chartedRows = -1;
  }
  chartedJob = job.job_id;
  drawCheckpoints(job.checkpoints);
  drawFailures(job.failures);
}

// -- the job's progress: JobClient.progress()'s figures, from the job master ---------------------
function drawProgress(p) {
  const parts = [];
  if (p.phase) parts.push(p.phase);
  if (p.rows_read !== undefined && p.rows_read !== null) {
    parts.push(p.rows_total ? `read ${num(p.rows_read)} of ${num(p.rows_total)} rows ` +
                              `(${percent(p.fraction_read)})` : `read ${num(p.rows_read)} rows`);
    if (p.read_per_s !== null) parts.push(`${num(p.read_per_s)} rows/s`);
    parts.push(`written ${num(p.rows_written)} rows`);
  }
  if (p.watermark_ms !== null && p.watermark_ms !== undefined) {
    parts.push(`watermark ${new Date(p.watermark_ms).toISOString()}`);
  }
  $("#job-progress").textContent = parts.join(" · ");
  showLag($("#job-lag"), p.watermark_lag_s === null || p.watermark_lag_s === undefined
    ? null : p.watermark_lag_s * 1000);
}

// -- the job graph: chains in columns by depth, edges with their partitioning --------------------
const BOX_W = 220, BOX_H = 120, GAP_X = 90, GAP_Y = 24;

function drawGraph(job) {
  // laid out again when a model pool first reports: its box gets a line per pool
  const key = job.job_id + JSON.stringify(job.graph.map((v) => [v.name, v.parallelism, v.inputs,
                                                                 (v.pools || []).length]));
  if (key !== graphKey) {
    graphKey = key;
    layOut(job.graph);
  }
  $("#graph-note").textContent = job.live ? "(live, per second)" : "(final figures)";
  for (const v of job.graph) {
    const box = document.querySelector(`.vertex[data-vertex="${CSS.escape(v.name)}"]`);
    box.querySelector(".rate-in").textContent = num(v.records_in_per_s);
    box.querySelector(".rate-out").textContent = num(v.records_out_per_s);
    box.querySelector(".records-out").textContent = num(v.records_out);
    box.querySelector(".backpressure").textContent = percent(v.backpressure);
    showLag(box.querySelector(".lag"), v.watermark_lag_ms);
    box.classList.toggle("busy", (v.backpressure || 0) > 0.5);
    (v.pools || []).forEach((pool, i) => {
      const line = box.querySelectorAll(".pool")[i];
      if (line) {
        line.textContent = `${pool.operator}: ${num(pool.actors)} actors, ` +
          `${num(pool.queue)} queued, ${num(pool.latency_ms)} ms/batch, ` +
          `busy ${num(pool.busy_s, 1)} s`;
      }
    });
  }
}

function layOut(graph) {
  const depth = {};
  const depthOf = (v) => {
    if (depth[v.id] === undefined) {
      depth[v.id] = 0;
      for (const input of v.inputs) {
        depth[v.id] = Math.max(depth[v.id], depthOf(graph[input.from]) + 1);
      }
    }
    return depth[v.id];
  };
  const columns = [];
  for (const v of graph) (columns[depthOf(v)] = columns[depthOf(v)] || []).push(v);
  const container = $("#graph");
  const boxes = graph.map((v) => {
    const box = el("div", {class: "vertex", "data-vertex": v.name});
    box.append(el("div", {class: "name"}, `${v.name} ×${v.parallelism}`),
               el("div", {class: "ops"}, v.operators.join(" → ")));
    const figures = el("dl");
    for (const [label, cls] of [["in/s", "rate-in"], ["out/s", "rate-out"], ["out", "records-out"],
                                ["backpressure", "backpressure"], ["watermark lag", "lag"]]) {
      figures.append(el("dt", {}, label), el("dd", {class: cls}, "-"));
    }
    box.append(figures);
    for (const pool of v.pools || []) {  // a model pool's actors (map_batches with a class)
      box.append(el("div", {class: "pool", title: `model pool of ${pool.operator}`}, "-"));
    }
    return box;
  });
  container.replaceChildren(...boxes);
  // rows are spaced by the tallest box (a long chain's operators wrap): none is clipped
  const boxH = Math.max(BOX_H, ...boxes.map((box) => box.offsetHeight));
  const pos = {};
  columns.forEach((column, x) => column.forEach((v, y) => {
    pos[v.id] = {x: x * (BOX_W + GAP_X), y: y * (boxH + GAP_Y)};
  }));
  const width = columns.length * (BOX_W + GAP_X);
  const height = Math.max(...columns.map((c) => c.length)) * (boxH + GAP_Y);
  container.style.height = `${height}px`;
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  graph.forEach((v, i) => {
    for (const input of v.inputs) {
      const a = pos[input.from], b = pos[v.id];
      const line = document.createElementNS(svgNS, "line");
      const [x1, y1, x2, y2] = [a.x + BOX_W, a.y + boxH / 2, b.x, b.y + boxH / 2];
      Object.entries({x1, y1, x2, y2, stroke: "#3b6ea5", "stroke-width": 2})
        .forEach(([k, val]) => line.setAttribute(k, val));
      const label = document.createElementNS(svgNS, "text");
      label.setAttribute("x", (x1 + x2) / 2 - 30);
      label.setAttribute("y", (y1 + y2) / 2 - 6);
      label.setAttribute("font-size", "11");
      label.setAttribute("class", "partitioning");
      label.textContent = input.partitioning;
      svg.append(line, label);
    }
    boxes[i].style.left = `${pos[v.id].x}px`;
    boxes[i].style.top = `${pos[v.id].y}px`;
  });
  container.prepend(svg);
}

// -- checkpoints ------------------------------------------------------------------------------------
function drawCheckpoints(rows) {
  const body = $("#checkpoints tbody");
  body.replaceChildren(...rows.slice().reverse().map((c) => {
    const row = el("tr", {"data-checkpoint": String(c.id), "data-status": c.status});
    row.append(el("td", {}, String(c.id)), el("td", {class: c.status}, c.status),
               el("td", {}, new Date(c.triggered_ms).toLocaleTimeString()),
               el("td", {}, seconds(c.duration_s)),
               el("td", {}, bytes(c.size)), el("td", {}, seconds(c.alignment_s)),
               el("td", {}, bytes(c.unaligned_bytes)),
               el("td", {class: c.savepoint ? "savepoint" : "reason"}, c.savepoint || c.reason || ""));
    return row;
  }));
  const done = rows.filter((c) => c.status === "COMPLETED");
  if (done.length === chartedRows) return;
  chartedRows = done.length;
  const ids = done.map((c) => c.id);
  const timeData = [ids, done.map((c) => c.duration_s), done.map((c) => c.alignment_s)];
  const byteData = [ids, done.map((c) => c.size), done.map((c) => c.unaligned_bytes)];
  if (charts === null) {
    const options = (title, series, format) => ({
      title, width: 460, height: 200, scales: {x: {time: false}},
      // checkpoint ids are whole numbers: ticks at whole steps only
      axes: [{label: "checkpoint", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]},
             {values: (u, values) => values.map(format), size: 70}],
      series: [{label: "checkpoint"}, ...series],
    });
    charts = [
      new uPlot(options("duration and alignment (s)",
                        [{label: "duration", stroke: "#3b6ea5", width: 2},
                         {label: "alignment", stroke: "#b36b00", width: 2}],
                        (v) => `${v.toFixed(2)} s`), timeData, $("#chart-time")),
      new uPlot(options("size and unaligned bytes",
                        [{label: "size", stroke: "#1f7a3a", width: 2},
                         {label: "unaligned", stroke: "#b3261e", width: 2}], bytes),
                byteData, $("#chart-bytes")),
    ];
  } else {
    charts[0].setData(timeData);
    charts[1].setData(byteData);
  }
}

// The recovery's stages, in seconds since the failure was detected (engine/recovery.py).
function stagesOf(stages) {
  if (!stages) return "";
  const reached = Object.entries(stages).filter(([stage]) => stage !== "detected")
    .map(([stage, s]) => `${stage.replace("_", " ")} ${s.toFixed(2)} s`);
  return reached.length ? `: ${reached.join(", ")}` : "";
}

// How many subtasks restored their state from their process's local copy (local recovery).
function localOf(restoredFrom) {
  const origins = Object.values(restoredFrom || {});
  if (!origins.length) return "";
  return `; ${origins.filter((o) => o === "local").length} of ${origins.length} subtasks restored locally`;
}

function drawFailures(failures) {
  const box = $("#failures");
  if (!failures.length) { box.textContent = "none"; return; }
  box.replaceChildren(...failures.map((f, i) => {
    const item = el("details", {class: "failure"});
    const where = f.operator ? ` in ${f.operator}` + (f.subtask !== null ? ` #${f.subtask}` : "") : "";
    const then = f.restarted
      ? `restarted from checkpoint ${f.restored_checkpoint ?? "none (from the start)"}` +
        (f.stages ? stagesOf(f.stages)
                  : f.restore_s !== null ? ` in ${f.restore_s.toFixed(2)} s` : "") +
        localOf(f.restored_from)
      : "not restarted";
    item.append(el("summary", {}, `failure ${i + 1}${where}: ${f.error.split("\n")[0]} — ${then}`),
                el("pre", {}, f.traceback || f.error));
    return item;
  }));
}

// -- actions: the client calls of `raystream savepoint`, `stop` and `cancel` -----------------------
async function act(action, body) {
  const message = $("#message");
  message.className = "";
  message.textContent = `${action}…`;
  try {
    const response = await fetch(`/api/jobs/${encodeURIComponent(selected)}/${action}`, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify(body || {})});
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || response.statusText);
    message.textContent = `${action}: ${answer.message}`;
  } catch (error) {
    message.className = "error";
    message.textContent = `${action} failed: ${error.message}`;
  }
  tick();
}

function savepointPath() {
  const path = $("#savepoint-path").value.trim();
  if (!path) {
    $("#message").className = "error";
    $("#message").textContent = "give a savepoint directory or URI first";
  }
  return path;
}

$("#savepoint-button").onclick = () => { const p = savepointPath(); if (p) act("savepoint", {path: p}); };
$("#stop-button").onclick = () => { const p = savepointPath(); if (p) act("stop", {path: p}); };
$("#cancel-button").onclick = () => act("cancel");
window.addEventListener("hashchange", () => {
  const job = new URLSearchParams(location.hash.slice(1)).get("job");
  if (job && job !== selected) { selected = job; tick(); }
});

async function tick() {
  try {
    await pollJobs();
    await pollJob();
  } catch (error) {
    $("#cluster").textContent = `could not reach the cluster: ${error.message}`;
    return;
  }
  $("#cluster").textContent = `jobs of this Ray cluster · updated ${new Date().toLocaleTimeString()}`;
}

tick();
setInterval(tick, POLL_MS);
